"""``rayemb convert`` (being written; see issue 14)."""

from __future__ import annotations

import argparse

from rayemb.errors import RayembError


def add_convert_arguments(p: argparse.ArgumentParser) -> None:
    pass


def convert_main(args: argparse.Namespace) -> int:
    raise RayembError("rayemb convert is not built yet.")
