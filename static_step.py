"""TorchEngine's static decode step (compile=True): fixed shapes, captured in CUDA graphs, gpt-fast style.

The pieces of the path that rollout.compile (and rollout.fuse) runs on a GPU, in one place; TorchEngine (engines.py)
inherits them from StaticDecode and calls them from its generate loop and its forward:
  - _static_step: one entry per batch shape (its device state _Rows, its KV cache) and per attention window a CUDA
    graph (_capture_window: captured when the generation first reaches the window, its warm-up's changes restored);
  - cache_window: the windows, 64, 128, 192, 256, 384, ... columns, so a step reads the KV written so far, not the
    whole cache sized for max_new_tokens;
  - _step_body: one step, the forward of every row's last token then its sample (the function that is captured, and
    compiled first under fuse);
  - _static_qkv / _static_mlp: q, k and v as one matmul with the concatenated base weights (_refresh_qkv), and the
    routed adapters of projections that share an input as one group (_refresh_lora_groups, _low_rank): 13 LoRA ops a
    layer instead of 21;
  - _matmul_attention: the fused step's attention form by batch size (ATTN_MATMUL_MIN_BATCH).
Every buffer a captured graph reads (concatenated weights, grouped adapters, routing masks) is refreshed in place,
outside the graph, when what it copies changed. CPU tests run the same step without capture (`_capture=False`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import lora

# The fused static step's attention at this many batch slots or more: two batched matmuls and an fp32 softmax, which
# inductor fuses with the mask, instead of SDPA's kernel. On an H200 at batch 256 (Qwen2.5-1.5B's shape, cache 192
# columns) the attention kernels took 630 us a step that way against 949 for cuDNN's flash kernel, which runs the 6
# queries of a KV head in a 64-query tile (two runs, the SDPA one with q, k, v as three matmuls); at batch 1 the
# matmuls ran 0.92x SDPA's tok/s; in plain graphs (unfused) 1.01x and 0.99x (docs/benchmarks.md). Between 1 and 256 nothing was measured: 64 is a guess, and
# bench/gpu_next.sh's fused-sdpa / fused-matmul forms A/B it.
ATTN_MATMUL_MIN_BATCH = 64


def cache_window(L: int, need: int) -> int:
    """The static decode step's attention window: the first of 64, 128, 192, 256, 384, 512, 768, 1024, ... columns
    (64 x 1, 2, 3, 4, 6, 8, 12, ...: a power of two or 1.5 times one) that holds `need` columns, at most the cache
    length L. A step reads the KV of at most 1.5x the columns written past 128 (64 or 128 before), not the whole
    cache sized for max_new_tokens; a cache of L columns takes about 2 log2(L / 64) windows (graphs), each captured
    when the generation first reaches it."""
    m = 1
    while 64 * m < need:
        m = 2 if m == 1 else (m * 3 // 2 if m & (m - 1) == 0 else m * 4 // 3)
    return min(64 * m, L)


class StaticDecode:
    """TorchEngine's static decode step (the module docstring); a mixin: it uses the engine's model, _alloc,
    _forward, _sample_into and _step_fn, and the state TorchEngine.__init__ sets (_graphs, _qkv, _lora_groups,
    _lora_group_keys, fuse, and the A/B hooks _capture, _qkv_matmul, _lora_group, _attention)."""

    def _static_step(self, B, L, S, filtered):
        """The static path's decode step for this shape -> (decode(W), static _Rows, step, P): the caller fills the
        static tensors, then each decode(W) samples token `step` of every row attending to the first W cache columns
        (cache_window) and advances `step`. With capture (CUDA) decode(W) replays a CUDA graph, one per window,
        captured the first time the window is needed (mid-generation: _capture_window's warm-up runs the step and
        restores what it changed, so the replay redoes that step; the windows' graphs share one memory pool, as
        they never run at once). It reads the weights, the routed LoRA buffers (lora.refresh_routed:
        refreshed in place before every call, outside the graph) and the routing mask in place, so an optimizer
        step is seen at the next replay; it is captured again when a tensor it reads is a new one (_graph_reads: FSDP
        gathering, a reloaded model), into the shape's own buffers: one KV cache a shape, however often the weights
        move. Once a call has found them moved since an earlier call, decode(W) attends to the whole cache: a call
        captures once (its later batches replay), not once a window (each capture: warm-up steps, a device sync, the
        allocator's cache emptied). The last two shapes are kept (each holds its own KV cache)."""
        if self._qkv_matmul:
            self._refresh_qkv()  # outside the step: the concatenated q/k/v weights it reads, current
        mods = list(lora.lora_modules(self.model).values())
        mask = mods[0].row_mask if mods else None
        w = self.model.model.embed_tokens.weight
        key = (B, L, S, filtered, None if mask is None else tuple(mask.shape), w.dtype, w.device)  # what the buffers fit
        if key not in self._graphs:
            dev = self.model.device
            init = dict(tok=torch.zeros(B, dtype=torch.long), pad=torch.zeros(B, dtype=torch.long),
                        key_ok=torch.ones(B, L + 1, dtype=torch.bool), temp=torch.ones(B, 1),
                        top_k=torch.zeros(B, 1, dtype=torch.long), top_p=torch.ones(B, 1),
                        greedy=torch.zeros(B, dtype=torch.bool), seed=torch.zeros(B, dtype=torch.long),
                        stop_ids=torch.full((B, S), -1), end=torch.full((B,), L), by_id=torch.zeros(B, dtype=torch.bool))
            # one column more than any window (W <= L), never attended: a window never spans the whole cache, so the
            # fused step's window size stays one symbol (W == the cache length would specialise another graph)
            b = self._alloc(B, L + 1, L, init)
            step = torch.ones((), dtype=torch.long, device=dev)  # the token being sampled
            P = torch.ones((), dtype=torch.long, device=dev)  # the prompt width (the cache column of token 0)
            static_mask = mask.clone() if mask is not None else None
            graphs, pool = {}, []  # window -> the step's replay; the graphs' shared memory pool
            seen = [None, False]  # what the graphs read (_graph_reads); whether it has moved between two calls

            def decode(W):
                W = L if seen[1] else W  # tensors that move from call to call: one capture a call, not one a window
                fn = graphs.get(W)
                if fn is None:
                    fn = graphs[W] = self._capture_window(b, step, P, filtered, W, pool, warmups=1 if graphs else 2)
                fn()

            for m in mods:
                m.row_mask = static_mask
            if static_mask is not None:  # the routed buffers exist before the step reads them (compiled or not)
                with torch.no_grad():
                    for m in mods:
                        m.routed_weights(w.dtype)  # (grouped below, every call)
            while len(self._graphs) >= 2:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = (decode, b, step, P, static_mask, graphs, pool, seen)
        decode, b, step, P, static_mask, graphs, pool, seen = self._graphs[key]
        if mask is not None:
            static_mask.copy_(mask)
            for m in mods:
                m.row_mask = static_mask
        lora.refresh_routed(self.model)  # an optimizer step since the last call: copied in place, outside the graph
        self._refresh_lora_groups()
        reads = self._graph_reads(mods if mask is not None else [], w.dtype)
        seen[1] = seen[1] or seen[0] not in (None, reads)  # moved since a call before (FSDP2's gather): from then on
        if seen[0] != reads:  # new tensors (parameters, or buffers made afresh): captured again
            graphs.clear()
            pool.clear()
            seen[0] = reads
        return decode, b, step, P

    def _graph_reads(self, mods, dtype) -> tuple:
        """The addresses of the tensors a captured step reads beyond its shape's own buffers: the parameters and
        the model's buffers (RoPE's inverse frequencies), the concatenated q/k/v weights and, where rows are routed
        (mods: the LoRA modules, none without routing), the routed LoRA buffers and their groups. A graph replays
        reads from the addresses it was captured with, so any of them moving (FSDP's gather, a reload, a round trip
        through another dtype whose parameters come back where they were but whose buffers do not) means capturing
        again."""
        ts = [*self.model.parameters(), *self.model.buffers(),
              *(t for _, *bufs in self._qkv for t in bufs if t is not None),
              *(t for m in mods if dtype in m._routed for t in m._routed[dtype][1:]),
              *(t for g in (self._lora_groups.values() if mods else ()) for t in g if t is not None)]
        return tuple(t.data_ptr() for t in ts)

    def _capture_window(self, b, step, P, filtered: bool, W: int, pool: list, warmups: int = 2):
        """The static step over the first W cache columns as a function that runs it: a CUDA graph of it, captured
        now, mid-generation; without capture (the CPU test hook) the step itself. First a warm-up runs the step for
        real: lazy inits, cuBLAS handles, the fused step's compilation; on a side stream on CUDA; twice for a shape's
        first window, once for each later one, whose only new work is a size (the fused step's window is symbolic).
        So what the step reads back or keeps (the last token, the step counter, the rows' ends and stop flags) is
        restored after it and the replay redoes that step; the KV column and the token it wrote are written again.
        The CPU hook runs the same warm-up and restore, so tests see them."""
        def run():
            self._step_fn(b, step, P, filtered, b.key_ok[:, :W])

        state = (b.tok, step, b.end, b.by_id)
        saved = [t.clone() for t in state]

        def warm_up():
            for _ in range(warmups):
                run()
                for t, v in zip(state, saved):
                    t.copy_(v)

        if not self._capture:
            warm_up()
            return run
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            warm_up()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool[0] if pool else None):
            run()
        if not pool:
            pool.append(graph.pool())
        return graph.replay

    def _step_body(self, b, step, P, filtered: bool, key_ok):
        """One static decode step: the forward of every row's last token at its cache column, attending to the cache
        columns of the window key_ok = b.key_ok[:, :W] (W > that column: cache_window), then token `step` sampled into
        b; advances `step`. Device ops only (captured in the CUDA graph; compiled when fuse)."""
        col = P + step - 1  # the cache column of the token sampled last
        logits = self._forward(b.tok[:, None], (col - b.pad)[:, None], col, b.kv, key_ok)
        self._sample_into(b, logits, step, filtered)
        step.add_(1)

    def _static_qkv(self, li: int, a, h):
        """The static step's q, k and v for h (B, 1, d): one matmul with the concatenated base weights
        (_refresh_qkv), then the adapters: the q/k/v group's 3 ops where there is one (_refresh_lora_groups),
        else each adapted projection's own delta."""
        projs = (a.q_proj, a.k_proj, a.v_proj)
        W, bias = self._qkv[li][1:]
        y = F.linear(h, W, bias)
        sizes = [p.out_features for p in projs]
        mask = next((p.row_mask for p in projs if isinstance(p, lora.LoRALinear)), None)
        # the routing first, the group only then: a routing-off step's compilation must not guard on the groups,
        # which a later routed call creates (it would compile again at the next routing-off call)
        g = None if mask is None else self._lora_groups.get((li, "qkv"))  # (there with two or more adapted)
        if g is not None:  # routed per row: the group's x A^T, the mask, one addmm with B block-diagonal into y
            A, B = g
            return torch.addmm(y.flatten(0, -2), self._low_rank(h, A, mask), B.t()).view(y.shape).split(sizes, -1)
        return [p.add_delta(h, yp) if isinstance(p, lora.LoRALinear) else yp for p, yp in zip(projs, y.split(sizes, -1))]

    def _static_mlp(self, li: int, mlp, x):
        """The static step's MLP of x (B, 1, d): gate and up's routed adapters as one group where there is one
        (one x A^T, the mask, an addmm each: 4 ops, not 6), else the module itself."""
        if getattr(mlp.gate_proj, "row_mask", None) is None:  # (the routing first, as in _static_qkv)
            return mlp(x)
        g = self._lora_groups.get((li, "mlp"))
        if g is None:
            return mlp(x)
        h = self._low_rank(x, g[0], mlp.gate_proj.row_mask)  # (B, 2R): both projections' masked activations
        R = h.shape[-1] // 2
        gate, up = (torch.addmm(p.base_layer(x).flatten(0, -2), h[:, i * R:(i + 1) * R],
                                p._routed[x.dtype][2].t()).view(x.shape[0], 1, -1)
                    for i, p in enumerate((mlp.gate_proj, mlp.up_proj)))
        return mlp.down_proj(mlp.act_fn(gate) * up)

    def _matmul_attention(self, B) -> bool:
        """Whether the static step attends with two batched matmuls and a softmax (which inductor fuses with the mask)
        instead of SDPA's kernel: under fuse at B >= ATTN_MATMUL_MIN_BATCH slots ("auto"), or always / never (the
        "matmul" / "sdpa" hooks)."""
        if self._attention != "auto":
            return self._attention == "matmul"
        return self.fuse and B >= ATTN_MATMUL_MIN_BATCH

    @staticmethod
    def _low_rank(x, A, mask):
        """The masked low-rank activations of k projections that read the same input x (B, 1, in): x A^T with A the
        members' A_cat stacked (kR, in), times the row mask (B, 1, R) broadcast over the k blocks -> (B, kR)."""
        h = (x.flatten(0, -2) @ A.t()).view(x.shape[0], -1, mask.shape[-1]) * mask.to(x.dtype).view(x.shape[0], 1, -1)
        return h.flatten(1)

    def _refresh_qkv(self):
        """The static path's q, k and v base weights (and biases) concatenated per layer into persistent buffers
        (self._qkv[layer] = [key, W (q+k+v out, in), bias or None]): one matmul a layer instead of three, which
        at batch 1 are latency-bound GEMVs (docs/benchmarks.md). Copied in place, outside the step, whenever a
        weight changed (its version counter or storage: a full-weight optimizer step, FSDP's gather, a reload),
        so a captured graph or compiled step reads the current weights at its next replay (under FSDP: every call,
        after the gather). Costs a whole copy of the three weights on every rank for the engine's life, as the
        captured graphs' KV caches stay: ~0.18 GB at Qwen2.5-1.5B's shape in bf16, ~0.9 GB at 7B."""
        for li, layer in enumerate(self.model.model.layers):
            a = layer.self_attn
            lin = [p.base_layer if isinstance(p, lora.LoRALinear) else p for p in (a.q_proj, a.k_proj, a.v_proj)]
            ts = [x.weight for x in lin] + [x.bias for x in lin if x.bias is not None]
            key = tuple((t.data_ptr(), t._version) for t in ts)
            if len(self._qkv) <= li:
                self._qkv.append([None, None, None])
            buf = self._qkv[li]
            ws = [x.weight for x in lin]
            has_bias = any(x.bias is not None for x in lin)
            shape = (sum(w.shape[0] for w in ws), ws[0].shape[1])
            W = buf[1]
            if (W is None or W.shape != shape or W.device != ws[0].device or W.dtype != ws[0].dtype
                    or (buf[2] is None) == has_bias):  # new buffers (_graph_reads: the graphs are captured again)
                buf[1] = torch.empty(shape, dtype=ws[0].dtype, device=ws[0].device)
                b0 = next((x.bias for x in lin if x.bias is not None), None)
                buf[2] = None if b0 is None else torch.empty(shape[0], dtype=b0.dtype, device=b0.device)
            elif buf[0] == key:
                continue
            bs = [x.bias if x.bias is not None else x.weight.new_zeros(x.out_features) for x in lin] if has_bias else None
            with torch.no_grad():  # in place: what a captured graph reads
                torch.cat(ws, out=buf[1])
                if bs is not None:
                    torch.cat(bs, out=buf[2])
            buf[0] = key

    def _refresh_lora_groups(self):
        """The static step's grouped adapters, per layer: q, k and v's routed A_cat stacked (one x A^T for all
        three, where the base is one matmul too) with their B_cat block-diagonal over the q/k/v output, and gate and
        up's A_cat stacked (one x A^T; each member's addmm reads its own B_cat). Persistent buffers in the compute
        dtype, copied in place from the modules' routed buffers (lora.refresh_routed, called first) whenever those
        changed, outside any graph: 13 LoRA ops a layer instead of 21 with all seven projections adapted and q, k, v
        in one matmul (with `_qkv_matmul=False` only gate and up group: 19). A group
        needs two members with adapters; with one, its projection adds its delta alone."""
        if not self._lora_group:
            return
        dtype = self.model.model.embed_tokens.weight.dtype
        for li, layer in enumerate(self.model.model.layers):
            a, mlp = layer.self_attn, layer.mlp
            for kind, projs in (("qkv", (a.q_proj, a.k_proj, a.v_proj) if self._qkv_matmul else ()),
                                ("mlp", (mlp.gate_proj, mlp.up_proj))):
                mods = [p for p in projs if isinstance(p, lora.LoRALinear)]  # the forward skips these ones' add_delta
                if (len(mods) < 2 or (kind == "mlp" and len(mods) != len(projs))
                        or any(dtype not in p._routed for p in mods)):
                    self._lora_groups.pop((li, kind), None)
                    self._lora_group_keys.pop((li, kind), None)
                    continue
                bufs = [p._routed[dtype] for p in mods]
                key = tuple((t.data_ptr(), t._version) for _, A, B in bufs for t in (A, B))
                R, d = bufs[0][1].shape
                g = self._lora_groups.get((li, kind))
                if (g is None or g[0].shape != (len(mods) * R, d) or g[0].device != bufs[0][1].device
                        or g[0].dtype != dtype):  # made afresh (another rank or adapter count): copied whatever the key
                    out = sum(p.out_features for p in projs)
                    g = self._lora_groups[(li, kind)] = (bufs[0][1].new_empty(len(mods) * R, d),
                                                         bufs[0][1].new_zeros(out, len(mods) * R) if kind == "qkv" else None)
                elif self._lora_group_keys.get((li, kind)) == key:
                    continue
                with torch.no_grad():  # in place: what a captured graph reads
                    torch.cat([A for _, A, _ in bufs], out=g[0])
                    o = 0
                    for p in projs if kind == "qkv" else ():  # B's diagonal blocks (the rest stays zero)
                        if p in mods:
                            j = mods.index(p)
                            g[1][o:o + p.out_features, j * R:(j + 1) * R].copy_(bufs[j][2])
                        o += p.out_features
                self._lora_group_keys[(li, kind)] = key
