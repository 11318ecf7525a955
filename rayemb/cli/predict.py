"""``rayemb predict`` (being written; see issue 14)."""

from __future__ import annotations

import argparse

from rayemb.errors import RayembError


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    pass


def predict_main(args: argparse.Namespace) -> int:
    raise RayembError("rayemb predict is not built yet.")
