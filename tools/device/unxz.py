#!/usr/bin/env python3
"""Decompresses an .xz file: unxz.py IN.xz OUT. The GPU machine's image has python3 but maybe not xz."""
import lzma
import shutil
import sys

if __name__ == "__main__":
    with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
