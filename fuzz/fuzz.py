"""Coverage-guided fuzz targets (atheris/libFuzzer): the pack reader and the
safetensors and GGUF header parsers raise only OrkError, whatever the bytes.

    python fuzz/make_corpus.py corpus/                 # once: seeds from real small files
    python fuzz/fuzz.py pack -max_total_time=60 corpus/pack/
    python fuzz/fuzz.py safetensors -max_total_time=60 corpus/safetensors/
    python fuzz/fuzz.py gguf -max_total_time=60 corpus/gguf/

See fuzz/harness.py for how the input bytes are shaped and what is checked.
"""
import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
with atheris.instrument_imports():
    import harness  # noqa: E402
    import orkpack.inspect, orkpack.pack.reader, orkpack.sources.gguf, orkpack.sources.safetensors  # noqa: E401,E402,F401

TARGETS = {
    "pack": lambda data: harness.check_pack(harness.pack_input(data)),
    "safetensors": lambda data: harness.check_safetensors(harness.safetensors_input(data)),
    "gguf": lambda data: harness.check_gguf(bytes(data)),
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(f"usage: python fuzz/fuzz.py {{{'|'.join(TARGETS)}}} [libFuzzer options] [corpus dir]", file=sys.stderr)
        sys.exit(2)
    target = TARGETS[sys.argv[1]]
    args = [sys.argv[0]] + sys.argv[2:]
    if not any(a.startswith("-max_len") for a in args):
        args.insert(1, "-max_len=262144")
    if not any(a.startswith("-rss_limit_mb") for a in args):
        args.insert(1, "-rss_limit_mb=1024")
    atheris.Setup(args, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
