"""ZenFlowAdamW's held-out loss against torch.optim.AdamW, from scratch (GPT-2-style and
Llama-style models built here) and fine-tuning (the demo's GPT). A thin caller of
`zenflow.bench.accuracy` (`python -m zenflow bench accuracy` runs the same code; its module
docstring describes the method).

    python benchmarks/bench_accuracy.py --regime scratch --arch gpt2,llama --steps 600 \\
        --lr 1e-3,3e-3 --seeds 0,1,2 --setting defaults --setting update_lag=window
    python benchmarks/bench_accuracy.py --regime finetune --arch tiny,small,medium --steps 300
"""

import sys

from zenflow.bench.accuracy import main

if __name__ == "__main__":
    sys.exit(main())
