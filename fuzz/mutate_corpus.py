"""The fixed campaign of the CI gate (tools/run_fuzz.sh): writes COUNT inputs mutated from the
committed corpus with a fixed seed, for the fuzz target to run once each.

libFuzzer's own campaign is guided by coverage, and the engine's host lane runs on a thread of
its own, so which inputs a seeded libFuzzer run keeps (and mutates next) depends on thread
timing: two runs of `-seed=1 -runs=N` part ways after a few thousand inputs. These inputs
depend on nothing but the corpus and the seed, so the same commit runs the same inputs and
gets the same result every time. (The exploratory campaign, `tools/run_fuzz.sh --explore`, is
libFuzzer's, guided by coverage, with a random seed.)

    python fuzz/mutate_corpus.py CORPUS_DIR OUT_DIR COUNT [SEED]

Mutations (one to four per input): flip a bit, set a byte to a value the harness treats
specially (0, 0xFF = NaN, 0xFE = inf, ...), write an int32 or int64 edge value (0, -1,
INT32_MAX, INT32_MAX - 1, INT64_MAX, ...) in little-endian order (step counts, indices and
counters of checkpoint buffers are stored that way), insert or erase bytes, or splice in a
piece of another input.
"""

from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

SPECIAL_BYTES = (0, 1, 2, 3, 4, 7, 8, 15, 16, 28, 31, 32, 61, 63, 64, 67, 71, 127, 128, 0xFE, 0xFF)
INT32_EDGES = (0, 1, -1, 2**31 - 1, 2**31 - 2, -(2**31), 2**16, 2**24 + 1)
INT64_EDGES = (0, -1, 2**63 - 1, 2**63 - 2, -(2**63), 2**62, 2**32)
MAX_LEN = 4096  # libFuzzer's default for this corpus


def mutate(data: bytearray, rng: random.Random, corpus: list[bytes]) -> bytearray:
    kind = rng.randrange(7)
    if not data and kind not in (4, 6):
        kind = 4
    if kind == 0:  # flip one bit
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # a byte the harness reads as a special choice
        data[rng.randrange(len(data))] = rng.choice(SPECIAL_BYTES)
    elif kind == 2:  # an int32 edge value
        i = rng.randrange(len(data))
        data[i : i + 4] = struct.pack("<i", rng.choice(INT32_EDGES))
    elif kind == 3:  # an int64 edge value
        i = rng.randrange(len(data))
        data[i : i + 8] = struct.pack("<q", rng.choice(INT64_EDGES))
    elif kind == 4:  # insert random bytes
        i = rng.randrange(len(data) + 1)
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    elif kind == 5:  # erase a run
        i = rng.randrange(len(data))
        del data[i : i + rng.randrange(1, 9)]
    else:  # splice in a piece of another input
        other = rng.choice(corpus)
        if other:
            start = rng.randrange(len(other))
            piece = other[start : start + rng.randrange(1, 65)]
            i = rng.randrange(len(data) + 1)
            data[i : i + len(piece)] = piece
    return data[:MAX_LEN]


def main() -> int:
    if len(sys.argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    corpus_dir, out_dir, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) == 5 else 1
    # Sorted by name: the same inputs whatever order the file system lists them in.
    corpus = [p.read_bytes() for p in sorted(corpus_dir.iterdir()) if p.is_file()]
    if not corpus:
        print(f"mutate_corpus.py: no inputs in {corpus_dir}", file=sys.stderr)
        return 1
    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        data = bytearray(rng.choice(corpus))
        for _ in range(rng.randrange(1, 5)):
            data = mutate(data, rng, corpus)
        (out_dir / f"mutant-{n:06d}").write_bytes(bytes(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
