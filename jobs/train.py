"""Entry point of a training job: ``ray job submit -- python jobs/train.py --config JOB.yaml``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

# Run from the job's working dir (the uploaded copy under `ray job submit --working-dir`),
# not from whichever rayemb happens to be installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rayemb.cli import run_cli  # noqa: E402
from rayemb.cli.train import add_train_arguments, train_main  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jobs/train.py",
        description="Train a rayemb job config on the Ray cluster this process is attached to.",
        epilog="example:\n  ray job submit --address http://127.0.0.1:8265 --working-dir . -- "
        "python jobs/train.py --config jobs/configs/synth_small.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_train_arguments(parser)
    parser.set_defaults(func=train_main)
    return run_cli(argv, parser)


if __name__ == "__main__":
    sys.exit(main())
