#!/usr/bin/env bash
# The GPU pass (issue 17): every CUDA path of the workbench run and measured, in one script that runs
# unchanged on any Linux machine with an NVIDIA GPU, torch (CUDA) and no network.
#
#     bash benchmarks/gpu_wheels.sh                 # first, where there is a network: wheels into .whl/
#     bash benchmarks/gpu_pass.sh all               # on the GPU machine, from the checkout's root
#     bash benchmarks/gpu_pass.sh tests             # or a stage at a time (a machine lent for 10-minute
#     bash benchmarks/gpu_pass.sh screens probe     #  commands takes three calls: tests; screens probe;
#     bash benchmarks/gpu_pass.sh syncs lightning   #  syncs lightning)
#
# Stages:
#   tests      the whole suite: `-m gpu` first (fp16 with its GradScaler, bf16, checkpointing, bit-exact
#              resume, pinned memory, compile, NVML, NCCL through torchrun on one GPU, world size 2 on one
#              GPU refused), then everything else
#   gpu-tests  only the `-m gpu` tests (CI runs the rest on a CPU)
#   screens    the real app on a real trainer on the GPU, driven by keys (benchmarks/gpu_screens.py):
#              NVML's figures, fp16 on/off/on, checkpointing's effect on the allocator peak and the
#              activation bytes; SVG captures and the screens as text
#   probe      probe_overhead.py on a launch-bound model (tiny_gpt) and a GPU-bound one (gpt100m.py); what the
#              optimizer-health figures cost a measured step (update_probe_cost.py)
#   syncs      host syncs per step per option, and what one per step costs (host_syncs.py)
#   gaps       where the GPU waits for the host, in the engine's steps and a bare loop's (benchmarks/gpu_gaps.py)
#   lightning  the same workloads under Lightning with its grad_norm logging (lightning_overhead.py)
#   trials     a controlled trial's power on the GPU: checkpointing=on and clip=1.0 judged, A/A trials
#              (trial_power.py, under its drifting load of one busy core)
#   fsdp       FSDP2 with NCCL against DDP at world size 1 through torchrun, on the GPT: step time, memory by
#              kind, the allocator's peak (parallel_cost.py; the `-m gpu` tests run it through the app's path too)
#   phases     where the time goes (issue 50): tiny_gpt and the GPT headless, amp off and bf16, each step's phases from
#              CUDA events on the stream, the verdict and the MFU against the table's peak (their last lines, and
#              how many rows' phases the stream timed); what the events cost is the probe stage's engine-untimed
#   forecast   will it fit (issue 49): the memory forecast against what the trainer measures by kind and against the
#              CUDA allocator's peak (max_memory_allocated), 5 models x 5 settings (memory_forecast.py: forecast.md)
#
# What it writes goes to $OUT (set by the machine's runner) or /tmp/gpu-pass: one log per stage, the
# benchmarks' JSON, env.txt. Python packages come from .whl/ into /tmp/site; torch is the machine's own.
# DEVICE=cpu runs the same stages on a CPU, to check the script itself where there is no GPU (with
# wheels fetched for that machine's Python: PYTHON_VERSION=3.11 bash benchmarks/gpu_wheels.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/gpu-pass}
mkdir -p "$out"
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
# On a CPU the ~92M-parameter GPT takes seconds a step: the check of the script trains a small one instead.
[[ $device == cpu ]] && export TORCHLAB_GPT100M_SMALL=1
stages=("$@")
[[ ${#stages[@]} -eq 0 || ${stages[0]} == all ]] && stages=(tests screens probe syncs gaps lightning trials fsdp forecast phases)

fail() { echo "gpu_pass.sh: $*" >&2; exit 2; }

setup() {
    [[ -d .whl ]] || fail "no .whl/ beside the checkout: run benchmarks/gpu_wheels.sh where there is a network, and carry .whl/"
    [[ $device == cpu ]] || "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || fail "torch sees no CUDA device here ($("$python" -c 'import torch; print(torch.__version__)' 2>&1)): this pass is for a GPU machine"
    rm -rf /tmp/site
    # The checkout itself, built and installed as a user's pip would (not editable): what is tested is the
    # package. Built from a copy of what git tracks or would track: setuptools reuses a stale build/ folder,
    # and a wheel built beside one carried modules deleted long ago.
    local source
    source=$(mktemp -d)
    if git rev-parse --git-dir >/dev/null 2>&1; then
        git ls-files --cached --others --exclude-standard -z | tar --null -cf - -T - | tar -xf - -C "$source"
    else  # a copy of the tree without its .git
        tar --exclude=./build --exclude=./.venv --exclude=./.whl --exclude=./dist -cf - . | tar -xf - -C "$source"
    fi
    # One install of the wheels and the checkout together: pip --target installs each package's scripts into
    # one bin/, and a second install into the same target leaves out (or, with --upgrade, replaces) that folder.
    "$python" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --target /tmp/site .whl/*.whl "$source" \
        || fail "the wheels in .whl/ or the checkout did not install (wheels fetched for another Python? PYTHON_VERSION in gpu_wheels.sh; setuptools >= 68 is needed to build the checkout)"
    [[ -x /tmp/site/bin/torchlab-tui ]] || fail "the install left no torchlab-tui script in /tmp/site/bin"
    export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
    {
        date -u
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
        "$python" - <<'EOF'
import platform, torch, textual, importlib.metadata as md
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), {gpu}, "
      f"textual {textual.__version__}")
for name in ("torchlab-tui", "nvidia-ml-py", "lightning", "pytorch-lightning", "pytest"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
EOF
        git log --oneline -1 2>/dev/null || true
    } > "$out/env.txt" 2>&1
    cat "$out/env.txt"
}

# What each stage runs, as one shell command line (run under its time limit by run_stage).
stage_command() {
    case $1 in
        tests) echo '"$python" -m pytest -q -m gpu -p no:cacheprovider -o timeout=300 ${PYTEST_ARGS:-}
                     echo "--- the rest of the suite"
                     "$python" -m pytest -q -m "not gpu" -p no:cacheprovider -o timeout=300 ${PYTEST_ARGS:-}' ;;
        gpu-tests) echo '"$python" -m pytest -q -m gpu -p no:cacheprovider -o timeout=300 ${PYTEST_ARGS:-}' ;;
        screens) echo '"$python" benchmarks/gpu_screens.py --device "$device" --out "$out/screens"' ;;
        probe) echo '"$python" benchmarks/probe_overhead.py --device "$device" --rounds 20 --json "$out/probe_tiny_gpt.json"
                     "$python" benchmarks/probe_overhead.py --device "$device" --workload benchmarks/gpt100m.py:workload \
                         --rounds 8 --steps-per-block 5 --json "$out/probe_gpt100m.json"
                     "$python" benchmarks/update_probe_cost.py --device "$device" --workloads tiny_gpt gpt100m' ;;
        syncs) echo '"$python" benchmarks/host_syncs.py --device "$device" --json "$out/syncs_tiny_gpt.json"
                     "$python" benchmarks/host_syncs.py --device "$device" --workload gpt100m --steps 10 --rounds 8 \
                         --json "$out/syncs_gpt100m.json"' ;;
        gaps) echo '"$python" benchmarks/gpu_gaps.py --device "$device" --workload gpt100m --json "$out/gaps_gpt100m.json"
                    "$python" benchmarks/gpu_gaps.py --device "$device" --workload tiny_gpt --json "$out/gaps_tiny_gpt.json"' ;;
        lightning) echo '"$python" benchmarks/lightning_overhead.py --device "$device" --json "$out/lightning_tiny_gpt.json"
                         "$python" benchmarks/lightning_overhead.py --device "$device" --workload gpt100m \
                             --rounds 6 --steps-per-block 5 --json "$out/lightning_gpt100m.json"' ;;
        trials) echo '"$python" benchmarks/trial_power.py --device "$device" --aa 20' ;;
        fsdp) echo '"$python" benchmarks/parallel_cost.py --device "$device" --workload gpt100m --world-size 1 --torchrun \
                        --segments 3 --segment 20' ;;
        forecast) echo '"$python" benchmarks/memory_forecast.py --device "$device" \
                            --models mlp convnet tiny_gpt tied_batchnorm hf_gpt2_trainer \
                            --settings off bf16 checkpointing split=2 accum=2 | tee "$out/forecast.md"' ;;
        phases) echo 'for amp in off bf16; do for workload in tiny_gpt benchmarks/gpt100m.py:workload; do
                          echo "--- $workload, amp=$amp"
                          run="$out/phases-$(basename "${workload%%.py*}")-$amp"
                          torchlab-tui "$workload" --headless --steps 120 --device "$device" --amp "$amp" \
                              --probe-every 10 --eval-every 0 --checkpoint-every 0 --run-dir "$run" 2>&1 | tail -n 8
                          echo "rows timed on the stream: $(grep -c "\"clock\":\"stream\"" "$run/metrics.jsonl")"
                      done; done' ;;
        *) return 1 ;;
    esac
}

# A stage runs under its limit, <STAGE>_LIMIT_S seconds (TESTS_LIMIT_S, GPU_TESTS_LIMIT_S, SCREENS_LIMIT_S, ...;
# none by default): a machine lent for a few minutes still gets every stage's log, each cut short at worst.
run_stage() {
    local stage=$1 log="$out/$1.log" limit_name
    limit_name="$(echo "${stage//-/_}" | tr '[:lower:]' '[:upper:]')_LIMIT_S"
    echo "=== $stage ($(date -u +%T))${!limit_name:+, at most ${!limit_name} s}"
    export python device out
    timeout -k 10 "${!limit_name:-0}" bash -c "$(stage_command "$stage")" 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    [[ $status == 124 ]] && echo "gpu_pass.sh: the $stage stage ran past ${!limit_name} s and was stopped" | tee -a "$log"
    return "$status"
}

for stage in "${stages[@]}"; do
    stage_command "$stage" >/dev/null || fail "no stage '$stage': tests, gpu-tests, screens, probe, syncs, gaps, lightning, trials, fsdp, forecast, phases or all"
done
setup
status=0
for stage in "${stages[@]}"; do
    run_stage "$stage" || status=1
done
echo "gpu_pass.sh: done ($(date -u +%T)); what it wrote is in $out"
exit $status
