"""Named LoRA adapters for any Hugging Face causal LM, hand-written at loralib's size.

One base model, several roles: each role wears its own adapter. `add_lora` wraps the target
`nn.Linear`s in `LoRALinear`; every adapter owns its own `lora_A` (r, in) and `lora_B` (out, r)
parameters, so each role gets its own optimizer and an update to one adapter leaves the base
and every other adapter bit-identical.

Three ways to run the model:
  set_adapter(model, "gen")     every row uses adapter "gen" (training, scoring)
  set_adapter(model, None)      the bare base model = the reference policy by default (no weight copy)
  set_row_adapters(model, [...]) row i uses its own adapter (or None), in ONE forward pass.

Per-row routing concatenates all adapters along the rank dimension, A_cat (R, in) and
B_cat (out, R) with R = sum of ranks, and multiplies the low-rank activations by a per-row
mask that holds the adapter's scale on that row's slots and 0 elsewhere:
  y = x W^T + ((x A_cat^T) * mask) B_cat^T
Two small matmuls for any mix of adapters, no Python loop over rows, and no gathered
(B, r, in) copies of the weights. It costs n_adapters x the single-adapter LoRA FLOPs, which
is small next to the base matmul for the handful of roles a troupe has. Under no_grad the
concatenated weights live in persistent buffers in the compute dtype, refreshed in place (outside
any CUDA graph) only when an adapter changed, which the parameters' version counters and storage
say: an optimizer step is seen at the next forward with no explicit sync, and a routed projection
is three kernels (x A_cat^T, the mask, and one addmm for y + h B_cat^T), none of them a concatenation
or a cast replayed on every decode step.

Adapters may have different ranks, alphas and targets (call add_lora once per setting). The
model wraps the union of every adapter's targets; on a wrapped module outside an adapter's own
targets the adapter is "absent": zero weights that never train, are never saved, add nothing.
Adapter weights are fp32 whatever the base dtype; the forward casts at the boundary.
Dropout acts only in training mode. Nothing ever merges adapter weights into the base in
place: `merged_state_dict` returns new tensors for export.

On disk we write PEFT's format (adapter_config.json + adapter_model.safetensors with keys
`base_model.model.<module>.lora_A.weight`), which peft.PeftModel and vLLM's LoRARequest load.

Deliberately left out: DoRA, rsLoRA, bias adapters, embedding adapters, quantized bases.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """Wraps a frozen `nn.Linear` (kept as `base_layer`, as peft does) with named adapters."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base_layer = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.lora_A = nn.ParameterDict()  # name -> (r, in)
        self.lora_B = nn.ParameterDict()  # name -> (out, r)
        self.scaling: dict[str, float] = {}
        self.dropout_p: dict[str, float] = {}
        self.active: str | None = None  # single adapter for every row
        self.row_mask: torch.Tensor | None = None  # (B, 1, R) per-row routing, overrides active
        self.row_dropout = 0.0  # the largest dropout of the adapters routed to (training mode only)
        self._routed: dict = {}  # dtype -> [key, A_cat, B_cat]: no-grad routed forwards' persistent buffers
        self.absent: set[str] = set()  # adapters whose targets leave this module out: zeros, frozen
        self.frozen: set[str] = set()  # adapters that never train (freeze_adapter), e.g. a KL reference

    def add(self, name: str, rank: int, alpha: float, dropout: float, generator=None, absent=False):
        if name in self.lora_A:
            raise ValueError(f"adapter {name!r} already exists")
        w = self.base_layer.weight
        A = torch.empty(rank, self.in_features, dtype=torch.float32)
        # peft's init: kaiming-uniform A (a=sqrt(5)), zero B, so a fresh adapter is the identity.
        bound = 1.0 / math.sqrt(self.in_features)
        if absent:
            A.zero_()
        else:
            A.uniform_(-bound, bound, generator=generator)
        # adapters are always fp32, even on a bf16 base: AdamW on bf16 params loses small updates
        self.lora_A[name] = nn.Parameter(A.to(device=w.device), requires_grad=not absent)
        self.lora_B[name] = nn.Parameter(torch.zeros(self.out_features, rank, device=w.device, dtype=torch.float32),
                                         requires_grad=not absent)
        self.scaling[name] = alpha / rank
        self.dropout_p[name] = dropout
        if absent:
            self.absent.add(name)
        self._routed = {}  # a new rank: new buffers

    def _drop(self, x, p):
        return F.dropout(x, p) if (self.training and p > 0) else x

    def routed_weights(self, dtype):
        """A_cat (R, in), B_cat (out, R) over all adapters in insertion order, in `dtype`. Under autograd:
        concatenated and cast afresh, so the gradient reaches every adapter's fp32 weights. Under no_grad:
        persistent buffers, refreshed IN PLACE when an adapter changed (a version counter moved: optimizer
        step, load_adapter; or its storage is new: FSDP's gather, a reload), so a CUDA graph that reads
        them sees the update at its next replay and never replays the concatenation or the cast."""
        As, Bs = list(self.lora_A.values()), list(self.lora_B.values())
        if torch.is_grad_enabled():
            return torch.cat(As, 0).to(dtype), torch.cat(Bs, 1).to(dtype)
        key = tuple((p.data_ptr(), p._version) for p in As + Bs)
        buf = self._routed.get(dtype)
        if buf is None or buf[0] != key:
            A, B = torch.cat(As, 0), torch.cat(Bs, 1)
            if buf is None or buf[1].shape != A.shape or buf[1].device != A.device:
                buf = self._routed[dtype] = [key, A.to(dtype), B.to(dtype)]
            else:
                buf[0] = key
                buf[1].copy_(A)
                buf[2].copy_(B)
        return buf[1], buf[2]

    def forward(self, x):  # x: (B, T, in)
        return self.add_delta(x, self.base_layer(x))

    def add_delta(self, x, y):
        """y (B, T, out), the base layer's output for x (B, T, in) -> y plus the active or routed adapters' part
        (forward = add_delta(x, base_layer(x)); a caller that computed y itself, as one matmul with other
        projections' weights, adds only this)."""
        # the adapter's matmuls run in the input's dtype (bf16 next to a bf16 base: tensor cores, no fp32
        # matmul with TF32 off) from fp32 master weights, which receive fp32 gradients through the cast
        if self.row_mask is not None:
            if torch.compiler.is_compiling() and not torch.is_grad_enabled():
                buf = self._routed.get(x.dtype)  # a compiled decode step: kept fresh outside it (refresh_routed)
                if buf is None:
                    raise RuntimeError(f"LoRALinear: no routed {x.dtype} buffers to read in a compiled step "
                                       f"(have {list(self._routed)}): call routed_weights({x.dtype}) before compiling")
                A_cat, B_cat = buf[1], buf[2]
            else:
                A_cat, B_cat = self.routed_weights(x.dtype)
            if self.training and self.row_dropout > 0:
                x = F.dropout(x, self.row_dropout)
            mask = self.row_mask if self.row_mask.dtype == x.dtype else self.row_mask.to(x.dtype)
            h = (x.flatten(0, -2) @ A_cat.t()).view(*x.shape[:-1], -1) * mask  # (B, T, R): the row's scale on its slots
            if h.dtype != y.dtype:
                return y + (h @ B_cat.t()).to(y.dtype)
            return torch.addmm(y.flatten(0, -2), h.flatten(0, -2), B_cat.t()).view(y.shape)  # y + h B_cat^T, one kernel
        if self.active is None:
            return y
        A, B = self.lora_A[self.active].to(x.dtype), self.lora_B[self.active].to(x.dtype)
        h = F.linear(self._drop(x, self.dropout_p[self.active]), A)  # (B, T, r)
        return y + F.linear(h * self.scaling[self.active], B).to(y.dtype)  # (B, T, out): scale the small side

    def delta_weight(self, name: str) -> torch.Tensor:
        """scale * B @ A, shaped like the base weight (out, in)."""
        return (self.lora_B[name] @ self.lora_A[name]) * self.scaling[name]

    def extra_repr(self):
        ranks = {n: a.shape[0] for n, a in self.lora_A.items()}
        return f"in={self.in_features}, out={self.out_features}, adapters={ranks}, active={self.active}"


# --------------------------------------------------------------------------------------------
# model-level helpers


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """{module path: LoRALinear}, e.g. 'model.layers.0.self_attn.q_proj'."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def adapter_names(model: nn.Module) -> list[str]:
    mods = list(lora_modules(model).values())
    return list(mods[0].lora_A.keys()) if mods else []


def add_lora(model, names, rank=8, alpha=16.0, dropout=0.0, targets=ALL_LINEAR, seed=None):
    """Add adapters `names` to every nn.Linear whose attribute name is in `targets`. In place.

    Freezes every parameter that is not a LoRA parameter. Can be called again to add more
    adapters with another rank, alpha or targets: modules newly targeted are wrapped, and every
    adapter is present on every wrapped module, "absent" (zeros, frozen, not saved) outside its
    own targets, so rows of any adapters still share one forward. `seed` makes the A-matrix init
    independent of the global RNG.
    """
    if isinstance(names, str):
        names = [names]
    if rank < 1:
        raise ValueError(f"add_lora: rank must be >= 1, got {rank}")
    targets = tuple(targets)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    before = lora_modules(model)
    old = list(next(iter(before.values())).lora_A) if before else []
    for path, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                wrapped = LoRALinear(child)
                setattr(mod, child_name, wrapped)
                m0 = next(iter(before.values()), None)
                for n in old:  # earlier adapters do not target this module: absent here
                    wrapped.add(n, m0.lora_A[n].shape[0], model._lora_config[n]["lora_alpha"], m0.dropout_p[n],
                                absent=True)
    existing = lora_modules(model)
    if not existing or not any(p.rsplit(".", 1)[-1] in targets for p in existing):
        raise ValueError(f"add_lora: no nn.Linear named any of {targets} in {type(model).__name__}")
    for p in model.parameters():
        p.requires_grad_(False)
    for path, m in existing.items():
        for n in names:
            m.add(n, rank, alpha, dropout, generator=gen, absent=path.rsplit(".", 1)[-1] not in targets)
    for m in existing.values():
        for n, p in m.lora_A.items():
            p.requires_grad_(n not in m.absent and n not in m.frozen)
        for n, p in m.lora_B.items():
            p.requires_grad_(n not in m.absent and n not in m.frozen)
    model._lora_config = getattr(model, "_lora_config", {})
    for n in names:
        model._lora_config[n] = dict(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets))
    return model


def freeze_adapter(model, name: str):
    """Adapter `name` never trains: no gradient now, nor after a later add_lora (which re-enables the
    others'), and no dropout. For a fixed copy of a starting point (the learner's KL reference)."""
    _check_names(model, [name])
    for m in lora_modules(model).values():
        m.frozen.add(name)
        m.dropout_p[name] = 0.0
        m.lora_A[name].requires_grad_(False)
        m.lora_B[name].requires_grad_(False)
    model._lora_config[name]["lora_dropout"] = 0.0


def _check_names(model, names):
    known = adapter_names(model)
    for n in names:
        if n is not None and n not in known:
            raise KeyError(f"unknown adapter {n!r}; the model has {known}")


def set_adapter(model, name: str | None):
    """Every row uses adapter `name`; None switches adapters off (the reference policy)."""
    _check_names(model, [name])
    for m in lora_modules(model).values():
        m.active, m.row_mask = name, None


def set_row_adapters(model, names_per_row):
    """Row i of the next forwards uses adapter names_per_row[i] (None = base)."""
    _check_names(model, names_per_row)
    mods = list(lora_modules(model).values())
    if not mods:
        return
    m0 = mods[0]
    names = list(m0.lora_A.keys())
    ranks = [m0.lora_A[n].shape[0] for n in names]
    offsets = [sum(ranks[:i]) for i in range(len(ranks))]
    mask = torch.zeros(len(names_per_row), 1, sum(ranks))  # (B, 1, R)
    for i, n in enumerate(names_per_row):
        if n is not None:
            j = names.index(n)
            mask[i, 0, offsets[j]: offsets[j] + ranks[j]] = m0.scaling[n]
    # in the compute dtype (the base's), so a routed forward casts nothing
    mask, dev = mask.to(m0.base_layer.weight.dtype), m0.lora_A[names[0]].device
    # from pinned memory, so the host does not wait for the queued kernels (collectives.to_device says why;
    # a leaf imports nothing of troupe)
    mask = mask.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else mask.to(dev)
    p = max([m0.dropout_p[n] for n in set(names_per_row) if n is not None], default=0.0)
    for m in mods:
        m.active, m.row_mask, m.row_dropout = None, mask, p


def adapter_config(model, name: str) -> dict:
    """{r, lora_alpha, lora_dropout, target_modules} of adapter `name` (what save_adapter writes)."""
    _check_names(model, [name])
    return dict(model._lora_config[name])


def refresh_routed(model, force: bool = False):
    """Bring every no-grad routed buffer up to date with its adapters, in place (LoRALinear.routed_weights):
    what a CUDA graph that reads them needs before a replay, since a replay runs no Python. force: copy
    even where the key looks unchanged (FSDP's gather may write new values into the same storage)."""
    with torch.no_grad():
        for m in lora_modules(model).values():
            for dtype in list(m._routed):
                if force:
                    m._routed[dtype][0] = None
                m.routed_weights(dtype)


def adapter_parameters(model, name: str) -> list[nn.Parameter]:
    """The parameters of adapter `name`, in a stable order (for its own optimizer)."""
    _check_names(model, [name])
    out = []
    for m in lora_modules(model).values():
        if name not in m.absent:
            out += [m.lora_A[name], m.lora_B[name]]
    return out


def adapter_state_dict(model, name: str) -> dict[str, torch.Tensor]:
    """PEFT key names -> tensors (not copies) of adapter `name`."""
    _check_names(model, [name])
    sd = {}
    for path, m in lora_modules(model).items():
        if name in m.absent:
            continue
        sd[f"base_model.model.{path}.lora_A.weight"] = m.lora_A[name]
        sd[f"base_model.model.{path}.lora_B.weight"] = m.lora_B[name]
    return sd


def save_adapter(model, name: str, directory, base_model_name_or_path: str | None = None, zeros: bool = False,
                 every_rank: bool = False, dtype: torch.dtype | None = None):
    """Write adapter `name` as PEFT does: adapter_config.json + adapter_model.safetensors.

    Written into a temp dir and renamed, so a crash never leaves a half-written adapter.
    zeros=True writes an identity adapter of the same shape (all zeros: adds exactly nothing).
    dtype: the tensors' dtype on disk (None: the fp32 master weights; a vLLM sync writes bf16 next to a bf16 base).
    Under torch.distributed every rank must call it (gathering FSDP shards is a collective); rank 0
    writes, or every rank when every_rank=True (each rank's own engine reads its own copy).
    """
    from safetensors.torch import save_file

    import torch.distributed as dist

    # under FSDP the adapter tensors are sharded DTensors: gathering them is a collective that
    # every rank must join; only rank 0 writes
    tensors = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in adapter_state_dict(model, name).items()}
    if dist.is_initialized() and dist.get_rank() != 0 and not every_rank:
        return
    directory = Path(directory)
    cfg = model._lora_config[name]
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {k: (torch.zeros_like(v) if zeros else v).detach().to("cpu", dtype or v.dtype).contiguous()
               for k, v in tensors.items()}
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    targets = sorted({p.rsplit(".", 1)[-1] for p, m in lora_modules(model).items() if name not in m.absent})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg["r"], "lora_alpha": cfg["lora_alpha"],
        "lora_dropout": cfg["lora_dropout"], "target_modules": targets, "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None, "use_rslora": False,
        "use_dora": False, "init_lora_weights": True,
        "base_model_name_or_path": base_model_name_or_path or getattr(model.config, "_name_or_path", None),
    }
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def load_adapter(model, name: str, directory):
    """Load a PEFT-format adapter into `name` (created if missing). A missing file is FileNotFoundError; anything
    else wrong (a config that is not JSON or lacks r / lora_alpha / target_modules, weights that do not load, hold
    NaN/inf, miss or add keys, or have other shapes than the rank says) is one ValueError naming the file, raised
    before any weight is copied."""
    from safetensors.torch import load_file

    directory = Path(directory)
    cfg_path, w_path = directory / "adapter_config.json", directory / "adapter_model.safetensors"
    for p in (cfg_path, w_path):
        if not p.exists():
            raise FileNotFoundError(f"load_adapter: {p} does not exist")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (ValueError, OSError) as e:
        raise ValueError(f"{cfg_path}: not an adapter config ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: not an adapter config (a JSON {type(cfg).__name__}, not an object)")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    if cfg.get("use_dora") or cfg.get("use_rslora"):
        raise ValueError(f"{cfg_path}: DoRA / rsLoRA adapters are not supported")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise ValueError(f"{cfg_path}: per-module ranks or alphas (rank_pattern / alpha_pattern) are not supported")
    r, alpha, targets = cfg.get("r"), cfg.get("lora_alpha"), cfg.get("target_modules")
    targets = [targets] if isinstance(targets, str) else targets
    if isinstance(r, bool) or not isinstance(r, int) or r < 1 or isinstance(alpha, bool) or \
            not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or \
            not (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)):
        raise ValueError(f"{cfg_path}: needs r (a positive int), lora_alpha (a number) and target_modules (names), "
                         f"got r={str(r)[:20]}, lora_alpha={str(alpha)[:20]}, target_modules={str(targets)[:60]}")
    try:
        state = load_file(str(w_path))
    except Exception as e:  # noqa: BLE001 (safetensors' own error types: a torn or foreign file)
        raise ValueError(f"{w_path}: does not load ({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
    # peft may write the adapter name into keys ("lora_A.default.weight"); accept both spellings.
    state = {k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v
             for k, v in state.items()}
    bad = [k for k, v in state.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{w_path}: tensor {bad[0]} holds NaN/inf")
    wrong_rank = [k for k, v in state.items() if k.endswith((".lora_A.weight", ".lora_B.weight"))
                  and (v.dim() != 2 or v.shape[0 if k.endswith(".lora_A.weight") else 1] != r)]  # others: unexpected keys
    if wrong_rank:
        raise ValueError(f"{w_path}: {wrong_rank[0]} has shape {tuple(state[wrong_rank[0]].shape)}, but "
                         f"{cfg_path.name} says r = {r}")
    if name not in adapter_names(model):
        add_lora(model, name, r, alpha, cfg.get("lora_dropout", 0.0), targets)
    own = adapter_state_dict(model, name)
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        raise ValueError(f"{w_path}: missing keys {sorted(missing)[:3]}..., unexpected {sorted(unexpected)[:3]}...")
    for k, p in own.items():
        if state[k].shape != p.shape:
            raise ValueError(f"{w_path}: {k} has shape {tuple(state[k].shape)}, model expects {tuple(p.shape)}")
    with torch.no_grad():
        for k, p in own.items():
            p.copy_(state[k])
    mods = lora_modules(model).values()
    for m in mods:
        m.scaling[name] = alpha / r
    model._lora_config[name] = dict(r=r, lora_alpha=alpha, lora_dropout=cfg.get("lora_dropout", 0.0),
                                    target_modules=cfg["target_modules"])
    return model


def merged_state_dict(model, name: str | None) -> dict[str, torch.Tensor]:
    """Full weights with adapter `name` merged, under the base model's own key names.

    New tensors; the model is untouched. For export (save_pretrained) and vLLM full-weight sync.
    """
    sd = {}
    with torch.no_grad():
        mods = lora_modules(model)
        for k, v in model.state_dict().items():
            if ".lora_A." in k or ".lora_B." in k:
                continue
            if ".base_layer." in k:
                path, leaf = k.split(".base_layer.")
                k = f"{path}.{leaf}"
                if leaf == "weight" and name is not None:
                    v = v + mods[path].delta_weight(name).to(v.dtype)
            sd[k] = v
    return sd
