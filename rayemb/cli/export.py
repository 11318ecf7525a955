"""``rayemb export`` (being written; see issue 14)."""

from __future__ import annotations

import argparse

from rayemb.errors import RayembError


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    pass


def export_main(args: argparse.Namespace) -> int:
    raise RayembError("rayemb export is not built yet.")
