"""The combination matrix (issue 47): real headless runs over every pair of the factors a user combines.

    .venv/bin/python -m benchmarks.matrix --fast            # a slice that covers the most pairs in a time target
    .venv/bin/python -m benchmarks.matrix --all --seed 0    # every pair, compile included
    .venv/bin/python -m benchmarks.matrix --all --only model=convnet --only parallel=fsdp2
"""
