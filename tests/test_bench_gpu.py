"""bench/gpu.py's CPU smoke mode: every code path of the GPU benchmark (random-init Qwen2 shapes, the static
decode step without capture checked against the eager loop, the roofline arithmetic, the fused update) on a
tiny config. The GPU figures themselves need a GPU: python bench/gpu.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
        assert float(cells[7]) > 0 and cells[8].endswith("%")  # the fair roofline beside the bench's own
    train = [c.strip() for c in table[4].strip("|").split("|")]
    assert float(train[1]) > 0 and len(train) == 5  # the update ran and was timed; both MFU counts (n/a on CPU)


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



def test_fair_roofline_and_prime_rl_flops_by_hand():
    """The fair roofline and prime-rl's LoRA-aware FLOPs on a model small enough to count by hand: hidden 4,
    2 heads (head_dim 2), 1 KV head, MLP 8, 1 layer, vocabulary 10."""
    import importlib.util
    from types import SimpleNamespace
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    c = SimpleNamespace(hidden_size=4, num_attention_heads=2, num_key_value_heads=1, intermediate_size=8,
                        num_hidden_layers=1, vocab_size=10)
    # q 4x4 + k 4x2 + v 4x2 + o 4x4 = 48; gate, up, down 3 x 32 = 96; lm_head 40
    assert gpu.active_mm_params(c) == 184
    # one row of 3 tokens, an adapter of 5 params: (4 x 184 + 6 x 5) x 3 + 12 x 1 x 2 x 2 x 3^2
    assert gpu.prime_rl_flops(c, 5, [3]) == 766 * 3 + 432
    assert gpu.prime_rl_flops(c, 5, [3, 3]) == 2 * (766 * 3 + 432)
    # batch 2, 1000 weight bytes, context 3: KV 2 x 1 x 2 x 1 x 2 x 3 x 2 = 48 bytes, logits 2 x 10 x 2 x 2 = 80;
    # 1128 bytes at 1000 B/s = 1.128 s; 2 x (2 x 184 + 4 x 1 x 2 x 2 x 3) = 832 FLOPs
    assert gpu.fair_roofline_tps(c, 2, 1000, 3, 1000.0, 1e9) == pytest.approx(2 / 1.128)
    assert gpu.fair_roofline_tps(c, 2, 1000, 3, 1000.0, None) == pytest.approx(2 / 1.128)
    assert gpu.fair_roofline_tps(c, 2, 1000, 3, 1000.0, 100.0) == pytest.approx(2 / 8.32)  # compute-bound
    assert gpu.fair_roofline_tps(c, 2, 1000, 3, 1e12, 100.0, adapter_params=10) == pytest.approx(2 / 8.72)

def test_random_model_writes_a_loadable_model_of_the_shape(tmp_path):
    """bench/random_model.py: config + random weights of a named shape beside a local tokenizer; the
    directory loads through model.load_model like a downloaded one (`smoke`'s vocabulary grows to fit)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("random_model", ROOT / "bench" / "random_model.py")
    random_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(random_model)  # (imports bench/gpu.py, which puts the repo root first on sys.path)
    from model import load_model
    _, tok = load_model("tiny")
    tok.save_pretrained(tmp_path / "tok")
    random_model.write("smoke", tmp_path / "tok", tmp_path / "m", dtype="float32")
    m, tok2 = load_model(str(tmp_path / "m"))
    assert m.config.hidden_size == 64 and m.config.num_hidden_layers == 2
    assert m.config.vocab_size >= len(tok2) and m.config.vocab_size % 64 == 0
    # the vocabulary and chat template travel (transformers reads the files through Qwen2's tokenizer class,
    # config.json's model_type, so digits may split differently from the source)
    ids = tok2("What is 2 + 3?")["input_ids"]
    assert tok2.decode(ids) == "What is 2 + 3?" and max(ids) < len(tok)
    assert tok2.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == \
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_gpu_check_overrides_parse_into_the_main_config():
    """The check's size overrides are real train.py flags that shrink configs/math_3agent.py as its docs say
    (total_epochs off, so total_steps counts; the embedded arithmetic data; TorchEngine)."""
    script = ROOT / "bench" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    small = subprocess.run(["bash", "-c", f'MODEL=/m; eval "$(sed -n "/^SMALL=(/,/)$/p" {script})"; '
                                          'printf "%s\\n" "${SMALL[@]}"'], capture_output=True, text=True, check=True)
    args = small.stdout.splitlines()
    assert args[:2] == ["--model.spec", "/m"]
    import train
    cfg = train.cli(["--config", str(ROOT / "configs" / "math_3agent.py"), *args, "--trainer.total-steps", "2"])
    assert cfg.trainer.total_epochs is None and cfg.trainer.total_steps == 2
    assert cfg.rollout.engine == "torch" and not cfg.rollout.progress and cfg.trainer.logger == ("console",)
    assert cfg.data.batch_size == 8 and cfg.rollout.num_chains == 4 and cfg.data.train_files == "data/arith_train.jsonl"
    assert [r.max_tokens for r in cfg.roles] == [96, 64, 96]
    # the FSDP form: one step saved every step, then a resume to step 2 (two steps did not fit the limit)
    fsdp = subprocess.run(["bash", "-c", f'MODEL=/m; RUNS=/r; eval "$(sed -n "/^SMALL=(/,/)$/p;/^FSDP=(/,/)/p" {script})"; '
                                         'printf "%s\\n" "${FSDP[@]}"'], capture_output=True, text=True, check=True)
    fargs = fsdp.stdout.splitlines()
    assert fargs[:3] == ["torchrun", "--nproc_per_node", "1"] and "train.py" in fargs
    cfg = train.cli([*fargs[fargs.index("train.py") + 1:], "--trainer.total-steps", "1"])
    assert cfg.trainer.save_freq == 1 and cfg.trainer.output_dir == "/r/run_fsdp" and cfg.data.batch_size == 8
    # no step-0 val and no periodic one: each FSDP run's time goes to its step, its end val and its checkpoint
    assert not cfg.trainer.val_before_train and cfg.trainer.test_freq > cfg.trainer.total_steps


def test_train_step_bench_runs_the_current_update_on_the_run_object_train_builds():
    """bench/train_step.py's "after" worker drives learner.prepare_adapter / policy_update on session.Run (it
    once built a Run by hand and broke when the update read new fields: refs, estimator_state)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for variant in ("after", "after-single"):
        r = subprocess.run([sys.executable, "bench/train_step.py", "--worker", variant, "--model", "tiny", "--repeats", "1"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["variant"] == variant and out["rows"] == 39 and out["seconds"] > 0


def test_gpu_next_smoke_runs_the_fused_decode_beside_the_graph(tmp_path):
    """bench/gpu_next.sh's CPU smoke form (SMOKE=1: tiny shapes, no capture) of parts B, F, P and U: the plain static step and
    rollout.fuse's compiled one, side by side, with the fused rows' tokens checked against the plain step's, and the
    small update with pinned and with pageable copies. The GPU figures in docs/benchmarks.md come from the same
    script on a GPU."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "SMOKE": "1", "PARTS": "BFPU",
           "FORMS": "none", "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_next.sh")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert not [e for e in res["errors"] if "skipped" not in e], res["errors"]
    # SMOKE's FUSED: "1x0 1x3:graph,fused,fused-cdt,graph-3mm,fused-3mm,graph-nogroup,graph-whole,graph-matmul
    # 4x3:graph,fused,graph-topp,fused-topp" (a cell alone: graph, then fused)
    topp = [d for d in res["decode"] if d["mode"] == "graph-topp"]
    assert [(d["batch"], d["adapters"]) for d in topp] == [(4, 3)] and topp[0]["same_tokens_rows_unfiltered"] < 1, topp
    forms = [d for d in res["decode"] if d["mode"] not in ("graph", "graph-topp")]
    assert [(d["batch"], d["adapters"], d["mode"]) for d in forms] == [
        (1, 0, "fused"), (1, 3, "fused"), (1, 3, "fused-cdt"), (1, 3, "graph-3mm"), (1, 3, "fused-3mm"),
        (1, 3, "graph-nogroup"), (1, 3, "graph-whole"), (1, 3, "graph-matmul"), (4, 3, "fused"), (4, 3, "fused-topp")]
    # compiled or not, tuned or not, q/k/v in one matmul or three, LoRA grouped or not, windowed or not (SMOKE's
    # prompt 60 + 6 tokens: a cache of 128 columns, windows of 64 then 128): on CPU the plain graph step's rows, their
    # logprobs bit for bit uncompiled; compiled, the sampler's normaliser sums in another order (an ulp: 4.8e-7 seen);
    # top_p 0.9 compiled (the threshold search) against the graph's sort (graph-topp): the same tokens too;
    # the attention as matmuls rounds otherwise (bf16 here): the same tokens, logprobs within 0.01 (5.8e-4 seen)
    tol = {"fused": 1e-5, "matmul": 0.01}
    assert all(d["tok_s"] > 0 and d["x_graph"] > 0 and d["same_tokens_rows"] == 1.0
               and d["max_lp_diff"] <= max([0.0] + [t for k, t in tol.items() if k in d["mode"]]) for d in forms), forms
    summary = (tmp_path / "summary.md").read_text()
    assert "| 4 | 3 |" in summary and "| 1 | 3 | graph-3mm |" in summary and "| 1 | 3 | fused-cdt |" in summary
    assert "| 1 | 3 | graph-nogroup |" in summary and "| 1 | 3 | graph-whole |" in summary
    assert "| 1 | 3 | graph-matmul |" in summary and "| 4 | 3 | fused-topp |" in summary
    # part U: the small update with its copies pinned and pageable, three timed runs each
    ups = [p for p in res["profile"] if "copies" in p]
    assert [p["copies"] for p in ups] == ["pinned", "pageable"] and all(len(p["walls_ms"]) == 3 for p in ups), ups
    assert "pageable copies" in summary
    # part B: the update with the chunked vocabulary projection and with whole logits, side by side
    assert [(u["micro"], u["grad_ckpt"], u["logits_chunk_tokens"]) for u in res["update"]] == [
        (4, False, 4), (4, False, 0), (4, True, 4)] and all(u["step_s"] > 0 for u in res["update"]), res["update"]
    assert "| 4 | False | whole |" in summary
    # part P: each fused row profiled on its own engine, and PROFILES' cell (SMOKE: "1x3:static-eager")
    profiled = [(p["batch"], p["adapters"], p["mode"]) for p in res["profile"] if "mode" in p]
    assert profiled == [(1, 0, "fused"), (1, 3, "fused"), (1, 3, "fused-cdt"), (1, 3, "fused-3mm"), (4, 3, "fused"),
                        (4, 3, "fused-topp"), (1, 3, "static-eager")], profiled


def test_logits_chunk_bench_runs_both_forms_and_they_train_alike():
    """bench/logits_chunk.py, cut to seconds: the chunked vocabulary projection and whole logits, each in its own
    process, the same pg_loss (the same update), a peak and a time for each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "logits_chunk.py"), "--chunks", "8,0", "--rows", "1",
                        "--micro", "1", "--prompt", "8", "--reply", "16", "--layers", "1", "--repeats", "1"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| 8 ") or line.startswith("| whole ")]
    assert [x[0].strip() for x in rows] == ["8", "whole"], r.stdout
    assert rows[0][3] == rows[1][3] and all(float(x[1]) > 0 and float(x[2]) >= 0 for x in rows), r.stdout


def test_cache_window_bench_reads_fewer_columns_for_the_same_tokens():
    """bench/cache_window.py, cut to seconds: the windowed static step and the whole-cache one, the same tokens, the
    KV columns read over 130 new tokens from a 28-token prompt (cache 192 columns): 0.65x."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "cache_window.py"), "--model", "tiny", "--new", "130",
                        "--rounds", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "window / whole: KV columns 0.65x" in r.stdout and "same tokens: True" in r.stdout, r.stdout
    assert "16,064 KV columns" in r.stdout and "24,768 KV columns" in r.stdout, r.stdout


def test_attention_forms_bench_compares_the_matmul_form_with_sdpa_and_the_eager_loop():
    """bench/attention_forms.py on the tiny model: in fp32 the matmul form, the static SDPA step and the eager loop give
    the same tokens (logprobs to 1e-4); in bf16 the matmul form differs from SDPA by no more than twice the static
    SDPA step's own spread against the eager loop (docs/benchmarks.md reports SmolLM2's figures)."""
    import re

    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(dtype):
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "attention_forms.py"), "--model", "tiny", "--new", "12",
                            "--dtype", dtype], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        got = {m[0]: (int(m[1]), int(m[2]), float(m[3])) for m in re.findall(
            r"(\w+ vs \w+): rows identical (\d+)/8, tokens agreeing before the first difference (\d+)/96, "
            r"max \|dlogprob\| over them ([\d.]+)", r.stdout)}
        assert set(got) == {"matmul vs sdpa", "sdpa vs eager", "matmul vs eager"}, r.stdout
        return got

    fp32 = run("float32")
    assert all(v[0] == 8 and v[1] == 96 and v[2] <= 1e-4 for v in fp32.values()), fp32
    bf16 = run("bfloat16")
    # the spread over the tokens before each row's first difference, and as many of them agreeing (a form that
    # diverged at once would compare no logprob at all)
    assert bf16["matmul vs sdpa"][2] <= 2 * bf16["sdpa vs eager"][2], bf16
    assert bf16["matmul vs sdpa"][1] >= bf16["sdpa vs eager"][1] / 2 > 0, bf16
