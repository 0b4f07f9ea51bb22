"""bench/gpu.py's CPU smoke mode: every code path of the GPU benchmark (random-init Qwen2 shapes, the static
decode step without capture checked against the eager loop, the roofline arithmetic, the fused update) on a
tiny config. The GPU figures themselves need a GPU: python bench/gpu.py."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_bench_cpu_smoke():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--cpu-smoke"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "static decode step (eager, no capture) == eager loop: True" in out
    table = [line for line in out.splitlines() if line.startswith("| smoke |")]
    assert len(table) == 5  # batch 1 and 4, 0 and 3 adapters; one train row
    for line in table[:4]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[3]) > 0 and float(cells[5]) > 0 and cells[6].endswith("%")
    assert float(table[4].strip("|").split("|")[1]) > 0  # the update ran and was timed


def test_peak_by_card_name_and_the_sampler_in_the_roofline():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    assert gpu.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and gpu.peak_tflops("NVIDIA H100 NVL") == 835.0
    assert gpu.peak_tflops("NVIDIA H200") == 989.0 and gpu.peak_tflops("Some CPU") is None
    # at batch 256 and a 152k vocabulary the sampler moves more bytes per step than 0.5B bf16 weights
    assert 256 * 151936 * gpu.SAMPLING_BYTES_PER_LOGIT > 2 * 494e6
