"""Coverage-guided fuzz target (atheris/libFuzzer): the safetensors reader raises only OrkError.

    python fuzz/make_corpus.py corpus/                # once: seeds from real small files
    python fuzz/fuzz_safetensors.py -max_total_time=60 corpus/safetensors/

See fuzz/harness.py for how the input bytes are shaped and what is checked.
"""
import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
with atheris.instrument_imports():
    import harness  # noqa: E402
    import orkpack.inspect, orkpack.pack.reader, orkpack.sources.gguf, orkpack.sources.safetensors  # noqa: E401,E402,F401


def TestOneInput(data: bytes) -> None:
    harness.check_safetensors(harness.safetensors_input(data))


def main() -> None:
    args = list(sys.argv)
    if not any(a.startswith("-max_len") for a in args):
        args.insert(1, "-max_len=262144")
    if not any(a.startswith("-rss_limit_mb") for a in args):
        args.insert(1, "-rss_limit_mb=1024")
    atheris.Setup(args, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
