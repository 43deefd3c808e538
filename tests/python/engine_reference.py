"""A plain float64 reference of the zenflow engine's algorithm (docs/design.md sections 2, 3
and the engine contract), written with simple loops over parameters and columns.

It does not import zenflow: it is the independent side of every engine test. It keeps the
full [m, n] state of every matrix (master, exp_avg, exp_avg_sq, per-column step counts) in
float64 and only tracks which columns are selected, so a re-selection is lossless by
construction: nothing moves, the state simply stays with its column.

What it models, step by step (after validation and the finiteness check):
  * global norm of the raw gradients / loss_scale, clip = min(1, max_norm / (norm + 1e-6)),
    used gradient = raw * clip / loss_scale;
  * warm-up (plain AdamW for everything), then windows of fixed S or of the "auto" rule;
  * selection at window 1 and at the first window start after each selection period,
    preceded by a flush; top-k by column energy, ties to the lower index, sorted;
  * selected columns and dense parameters: AdamW every step; deferred columns: accumulated,
    one host AdamW per window with A / steps_accumulated and the last accumulated lr;
    window_scaling "sqrt" / "linear" makes that update stand for the window's S steps
    (S = steps_accumulated): lr * sqrt(S) or lr * S, moments decayed by beta^S, step counts
    advanced by S (bias corrections 1 - beta^count with the betas themselves), and AdamW's
    weight decay applied as S steps would, (1 - lr * wd)^S; "none": a plain step;
  * overlap: a window's host result reaches the visible weights at the next window's close,
    or with update_lag L after the L-th step of the next window (at its close if sooner);
  * flush(); dynamic loss scaling (skip everywhere, backoff, growth); a non-finite
    gradient without loss scaling raises ValueError and changes nothing;
  * counters: steps, windows, reselections, skipped_steps, bytes_down, bytes_up.

`weights(i)` is what the engine's parameter tensor holds (in float64, before rounding to the
parameter's dtype); `state(i)` is the exact current state of every column (what a checkpoint
taken after a flush holds).

Choices where the contract is silent (the engine must make the same ones):
  * `lrs=None` means each group's lr given at construction (a passed lr is not sticky).
  * `windows` counts the host updates run after warm-up: a window close that finds steps
    accumulated, and a flush's own update (a close that finds nothing after a flush does
    not count); `reselections` counts selections after the first one.
  * Dense parameters never count in bytes. A warm-up step has no selection yet, so every
    matrix goes down whole and comes back up whole (m * n elements each way). After warm-up,
    bytes_down counts every step's deferred columns (m * (n - k) elements, the gradient's
    element size); bytes_up counts every host result written into the parameter (window
    close without overlap, the in-flight result at the next close or at a flush, and a
    flush's own update), m * (n - k) elements in the parameter's element size.
  * `select_interval="auto"` with strategy "epoch" means one epoch. The "auto" strategy with
    steps_per_epoch > 0 is the "step" rule with a period of steps_per_epoch steps.
  * skipped_steps counts only dynamic-loss-scaling overflow steps; the ValueError of a
    non-finite gradient without loss scaling changes nothing, counters included.
  * Before the first selection (during warm-up) no column is selected (`selected(i)` is
    None); master_weights is ignored (the reference is exact; the engine's "none" rounds).
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_CONFIG = {
    "topk_ratio": 0.1,
    "select_strategy": "auto",
    "select_interval": "auto",
    "steps_per_epoch": 0,
    "update_interval": 4,
    "full_warm_up_rounds": 0,
    "overlap_step": True,
    "update_lag": 1,
    "auto_ratio": 0.99,
    "pt_reserved_cores_perc": 0.5,
    "max_update_interval": 16,
    "master_weights": "fp32",
    "selection_score": "step",
    "max_grad_norm": None,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "loss_scaling": "none",
    "initial_scale": 65536.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
    "hysteresis": 1,
    "consecutive_hysteresis": False,
    "min_loss_scale": None,
    "bucket_bytes": 64 << 20,
    "staging_slots": 4,
    "window_scaling": "sqrt",
    "auto_warm_up_rounds": 200,
}
# auto_warm_up_rounds: the steps read before the decision, and the consistent share of the
# gradient from which a run is taken for one from scratch (engine.h).
START_PROBE_STEPS, FROM_SCRATCH_SHARE = 8, 0.25

STAT_KEYS = ("steps", "windows", "reselections", "skipped_steps", "bytes_down", "bytes_up")


def as_float64(x) -> tuple[np.ndarray, int]:
    """A float64 numpy copy of a torch tensor or array-like, and its element size in bytes."""
    if hasattr(x, "detach"):  # a torch tensor (bf16 has no numpy dtype: widen in torch)
        import torch

        return x.detach().cpu().to(torch.float64).numpy().copy(), x.element_size()
    arr = np.asarray(x)
    return arr.astype(np.float64, copy=True), arr.dtype.itemsize


def topk_columns(score: np.ndarray, k: int) -> np.ndarray:
    """The k largest scores, ties to the lower index, returned sorted ascending."""
    order = sorted(range(len(score)), key=lambda j: (-score[j], j))
    return np.array(sorted(order[:k]), dtype=np.int64)


def adamw_(p, m, v, g, steps, lr, wd, b1, b2, eps, span=1, step_lr=None):
    """torch.optim.AdamW's formula in place; `steps` = counts after incrementing (broadcast
    along the last axis: one per column for a matrix block). span > 1: one update standing for
    `span` steps of gradient g: decay (1 - lr * wd)^span, moments decayed by beta^span, the
    step taken with step_lr; the bias corrections follow `steps` as always."""
    bc1 = 1.0 - b1 ** steps.astype(np.float64)
    bc2 = 1.0 - b2 ** steps.astype(np.float64)
    step_lr = lr if step_lr is None else step_lr
    p *= (1.0 - lr * wd) ** span
    d1, d2 = b1**span, b2**span
    m *= d1
    m += (1.0 - d1) * g
    v *= d2
    v += (1.0 - d2) * g * g
    p -= (step_lr / bc1) * m / (np.sqrt(v) / np.sqrt(bc2) + eps)


class _Param:
    def __init__(self, value: np.ndarray, itemsize: int, group: int, dense: bool):
        self.shape = value.shape
        self.itemsize = itemsize
        self.group = group
        self.matrix = value.ndim >= 2 and not dense
        if self.matrix:
            self.rows = value.shape[0]
            self.cols = int(np.prod(value.shape[1:]))
            value = value.reshape(self.rows, self.cols)
        else:
            value = value.reshape(1, -1)  # one "column" of state: a dense step count
        self.master = value.copy()
        self.weights = value.copy()
        self.exp_avg = np.zeros_like(value)
        self.exp_avg_sq = np.zeros_like(value)
        self.steps = np.zeros(self.cols if self.matrix else 1, dtype=np.int64)
        self.selected: np.ndarray | None = None
        self.accum = np.zeros_like(value) if self.matrix else None
        self.k = 0

    def deferred(self) -> np.ndarray:
        mask = np.ones(self.cols, dtype=bool)
        if self.selected is not None:
            mask[self.selected] = False
        return np.nonzero(mask)[0]


class ReferenceZenFlow:
    def __init__(self, params, groups, config=None):
        cfg = dict(DEFAULT_CONFIG)
        for key, value in (config or {}).items():
            if key not in DEFAULT_CONFIG:
                raise ValueError(f"config: unknown key {key!r}")
            cfg[key] = value
        self.config = cfg
        self._validate_config()
        self.groups = []
        owner = [None] * len(params)
        for gi, group in enumerate(groups):
            self.groups.append(
                {
                    "lr": float(group["lr"]),
                    "weight_decay": float(group.get("weight_decay", 0.0)),
                    "dense": bool(group.get("dense", False)),
                }
            )
            for index in group["params"]:
                if owner[index] is not None:
                    raise ValueError(f"groups: parameter {index} is in two groups")
                owner[index] = gi
        if any(o is None for o in owner):
            raise ValueError(f"groups: parameter {owner.index(None)} is in no group")
        self.params: list[_Param] = []
        for index, tensor in enumerate(params):
            value, itemsize = as_float64(tensor)
            gi = owner[index]
            self.params.append(_Param(value, itemsize, gi, self.groups[gi]["dense"]))
        ratio = cfg["topk_ratio"]
        for p in self.params:
            if p.matrix:
                p.k = 0 if ratio == 0 else min(p.cols, max(1, math.floor(ratio * p.cols)))

        # Schedule and counters.
        self.t = 0  # counted (not skipped) steps
        # The synchronous start's decided end: -1 undecided (auto_warm_up_rounds > 0).
        self.warm_up_end = -1 if cfg["auto_warm_up_rounds"] > 0 else 0
        self.window_index = 0  # windows started after warm-up
        self.steps_in_window = 0
        self.last_selection_step = None
        self.steps_accumulated = 0
        self.last_accumulated_lrs = None
        # (betas, eps, weight decay per group) of the last accumulated step: the window's
        # host update runs with them, as with its lrs.
        self.last_accumulated_hparams = None
        self.pending = None  # overlap: list of (param, columns, values) not yet written
        self.window_score = [None] * len(self.params)  # c summed over the open window
        self.previous_window_score = [None] * len(self.params)
        self.energy_selected = [0.0] * len(self.params)
        self.energy_deferred = [0.0] * len(self.params)
        self.loss_scale = float(cfg["initial_scale"]) if cfg["loss_scaling"] == "dynamic" else 1.0
        self.growth_tracker = 0
        # DeepSpeed's DynamicLossScaler, written as it counts: overflows left before a backoff.
        self.hysteresis_left = int(cfg["hysteresis"])
        self.last_global_norm = 0.0
        self.counters = dict.fromkeys(STAT_KEYS, 0)
        # Every close decision of the auto rule: (step, matrix, E_def / E_sel); and every
        # selection's gap between the k-th and (k+1)-th score relative to the k-th. Tests
        # use them to check a random case is far from a tie (fp32 could flip a tie).
        self.auto_ratios: list[tuple[int, int, float]] = []
        self.selection_gaps: list[float] = []
        self.selection_steps: list[int] = []

    # ---- configuration ----

    def _validate_config(self):
        cfg = self.config
        if not 0.0 <= cfg["topk_ratio"] <= 1.0:
            raise ValueError("config: topk_ratio must be in [0, 1]")
        ui = cfg["update_interval"]
        if ui != "auto" and (not isinstance(ui, int) or ui < 1):
            raise ValueError("config: update_interval must be 'auto' or an int >= 1")
        if cfg["select_strategy"] not in ("step", "epoch", "auto"):
            raise ValueError("config: select_strategy must be 'step', 'epoch' or 'auto'")
        si = cfg["select_interval"]
        if si != "auto" and (not isinstance(si, int) or si < 1):
            raise ValueError("config: select_interval must be 'auto' or an int >= 1")
        if cfg["select_strategy"] == "epoch" and cfg["steps_per_epoch"] <= 0:
            raise ValueError("config: select_strategy 'epoch' needs steps_per_epoch > 0")
        if cfg["selection_score"] not in ("step", "window"):
            raise ValueError("config: selection_score must be 'step' or 'window'")
        if cfg["loss_scaling"] not in ("none", "dynamic"):
            raise ValueError("config: loss_scaling must be 'none' or 'dynamic'")
        if cfg["window_scaling"] not in ("none", "sqrt", "linear"):
            raise ValueError("config: window_scaling must be 'none', 'sqrt' or 'linear'")
        if cfg["max_update_interval"] < 1:
            raise ValueError("config: max_update_interval must be >= 1")

    def selection_period(self):
        """Steps between selections, or None (select once, at window 1)."""
        cfg = self.config
        strategy, interval = cfg["select_strategy"], cfg["select_interval"]
        spe = cfg["steps_per_epoch"]
        if strategy == "step" and interval != "auto":
            return interval
        if strategy == "epoch":
            return (1 if interval == "auto" else interval) * spe
        return spe if spe > 0 else None  # "auto", or "step" with select_interval "auto"

    # ---- accessors ----

    def weights(self, i: int) -> np.ndarray:
        p = self.params[i]
        return p.weights.reshape(p.shape).copy()

    def state(self, i: int) -> dict:
        p = self.params[i]
        return {
            "master": p.master.reshape(p.shape).copy(),
            "exp_avg": p.exp_avg.reshape(p.shape).copy(),
            "exp_avg_sq": p.exp_avg_sq.reshape(p.shape).copy(),
            "steps": p.steps.copy(),
        }

    def selected(self, i: int):
        sel = self.params[i].selected
        return None if sel is None else sel.copy()

    def k(self, i: int) -> int:
        return self.params[i].k

    def stats(self) -> dict:
        out = dict(self.counters)
        out["last_global_norm"] = self.last_global_norm
        return out

    # ---- per-step hyper-parameters ----

    def hyperparameters(self) -> tuple:
        """(betas, eps, weight decay per group) that the next step uses."""
        wds = tuple(g["weight_decay"] for g in self.groups)
        return tuple(self.config["betas"]), float(self.config["eps"]), wds

    def set_hyperparameters(self, betas, eps, weight_decays=None):
        """Betas, eps and (optionally) each group's weight decay of every later step. A
        step's selected columns and dense parameters use the values of that step; a
        window's host update those of the window's last accumulated step."""
        b1, b2 = (float(b) for b in betas)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0) or not (math.isfinite(eps) and eps >= 0.0):
            raise ValueError("betas must be in [0, 1) and eps finite and >= 0")
        if weight_decays is not None:
            if len(weight_decays) != len(self.groups):
                raise ValueError("weight_decays: one value per group")
            if not all(math.isfinite(w) and w >= 0.0 for w in weight_decays):
                raise ValueError("weight_decays: finite and >= 0")
            for group, wd in zip(self.groups, weight_decays):
                group["weight_decay"] = float(wd)
        self.config["betas"], self.config["eps"] = (b1, b2), float(eps)

    # ---- the step ----

    def step(self, grads, lrs=None):
        if len(grads) != len(self.params):
            raise ValueError(f"grads: expected {len(self.params)} gradients, got {len(grads)}")
        if lrs is None:
            lrs = [g["lr"] for g in self.groups]
        if len(lrs) != len(self.groups):
            raise ValueError(f"lrs: expected {len(self.groups)} values, got {len(lrs)}")
        raw, grad_sizes = [], []
        for i, (g, p) in enumerate(zip(grads, self.params)):
            value, itemsize = as_float64(g)
            if value.shape != p.shape:
                raise ValueError(f"grads[{i}]: shape {value.shape} != parameter {p.shape}")
            raw.append(value.reshape(p.master.shape))
            grad_sizes.append(itemsize)

        for i, g in enumerate(raw):
            if not np.all(np.isfinite(g)):
                if self.config["loss_scaling"] == "dynamic":
                    if self.hysteresis_left > 1:
                        self.hysteresis_left -= 1
                    else:
                        floor = self.config["min_loss_scale"] or 0.0
                        self.loss_scale = max(
                            self.loss_scale * self.config["backoff_factor"], floor
                        )
                    self.growth_tracker = 0
                    self.counters["skipped_steps"] += 1
                    return False
                raise ValueError(f"gradient of parameter {i} has non-finite values")

        norm = math.sqrt(sum(float(np.sum(g * g)) for g in raw)) / self.loss_scale
        self.last_global_norm = norm
        clip = 1.0
        if self.config["max_grad_norm"] is not None:
            clip = min(1.0, self.config["max_grad_norm"] / (norm + 1e-6))
        used = [g * (clip / self.loss_scale) for g in raw]

        self.t += 1
        self.counters["steps"] += 1
        if self.warm_up(self.t):
            for i, (p, g) in enumerate(zip(self.params, used)):
                self._adamw_all(p, g, lrs[p.group])
                if p.matrix:  # nothing is selected yet: the whole matrix goes down and up
                    self.counters["bytes_down"] += p.weights.size * grad_sizes[i]
                    self.counters["bytes_up"] += p.weights.size * p.itemsize
            auto = self.config["auto_warm_up_rounds"]
            if self.warm_up_end < 0 and self.t >= min(START_PROBE_STEPS, auto):
                from_scratch = self.start_signal_share() >= FROM_SCRATCH_SHARE
                self.warm_up_end = max(auto, self.t) if from_scratch else self.t
        else:
            self._windowed_step(raw, used, grad_sizes, lrs)

        if self.config["loss_scaling"] == "dynamic":
            if self.config["consecutive_hysteresis"]:
                self.hysteresis_left = int(self.config["hysteresis"])
            self.growth_tracker += 1
            if self.growth_tracker == self.config["growth_interval"]:
                self.loss_scale *= self.config["growth_factor"]
                self.growth_tracker = 0
                self.hysteresis_left = int(self.config["hysteresis"])
        return True

    def warm_up(self, t: int) -> bool:
        end = self.warm_up_end
        return t <= self.config["full_warm_up_rounds"] or end < 0 or t <= end

    def start_signal_share(self) -> float:
        """The consistent share of the gradient in the matrices' moments: (R - f) / (1 - f),
        R = sum(m_hat^2) / sum(v_hat), f = R of independent noise after t steps."""
        (b1, b2), _, _ = self.hyperparameters()
        m_hat_sq = v_hat = 0.0
        for p in self.params:
            if not p.matrix:
                continue
            steps = p.steps.astype(np.float64)
            ok = steps > 0
            m_hat = p.exp_avg[:, ok] / (1.0 - b1 ** steps[ok])
            m_hat_sq += float(np.sum(m_hat * m_hat))
            v_hat += float(np.sum(p.exp_avg_sq[:, ok] / (1.0 - b2 ** steps[ok])))
        if v_hat <= 0.0 or self.t < 2 or b1 <= 0.0:
            return 0.0
        noise = (1 - b1) / (1 + b1) * (1 + b1**self.t) / (1 - b1**self.t)
        return (m_hat_sq / v_hat - noise) / (1 - noise)

    def _moments_to_windows(self):
        """The first window after per-step updates of every column: a deferred column's
        second moment becomes that of the mean of S steps' gradients (the same signal, 1/S
        of the noise): v_hat <- m_hat^2 + max(0, v_hat - m_hat^2) / S."""
        span = self.config["update_interval"]
        if self.config["window_scaling"] == "none" or span == "auto" or span <= 1:
            return
        (b1, b2), _, _ = self.hyperparameters()
        for p in self.params:
            if not p.matrix:
                continue
            cols = p.deferred()
            steps = p.steps[cols].astype(np.float64)
            cols, steps = cols[steps > 0], steps[steps > 0]
            if len(cols) == 0:
                continue
            bc1, bc2 = 1.0 - b1**steps, 1.0 - b2**steps
            signal = (p.exp_avg[:, cols] / bc1) ** 2
            noise = np.maximum(0.0, p.exp_avg_sq[:, cols] / bc2 - signal)
            p.exp_avg_sq[:, cols] = (signal + noise / span) * bc2

    def _adamw_all(self, p: _Param, g: np.ndarray, lr: float):
        (b1, b2), eps, wds = self.hyperparameters()
        p.steps += 1
        adamw_(p.master, p.exp_avg, p.exp_avg_sq, g, p.steps, lr, wds[p.group], b1, b2, eps)
        p.weights[...] = p.master

    def _adamw_columns(
        self, p: _Param, cols: np.ndarray, g: np.ndarray, lr: float, hparams=None, span=1
    ):
        """AdamW on the columns `cols` of a matrix with gradient block g [m, len(cols)], with
        `hparams` (betas, eps, weight decays; default: the current ones); span > 1: the window
        update standing for `span` steps (window_scaling)."""
        (b1, b2), eps, wds = hparams if hparams is not None else self.hyperparameters()
        if len(cols) == 0:
            return
        master, m, v = p.master[:, cols], p.exp_avg[:, cols], p.exp_avg_sq[:, cols]
        p.steps[cols] += span
        step_lr = lr
        if span > 1:
            step_lr = lr * (math.sqrt(span) if self.config["window_scaling"] == "sqrt" else span)
        adamw_(master, m, v, g, p.steps[cols], lr, wds[p.group], b1, b2, eps, span, step_lr)
        p.master[:, cols], p.exp_avg[:, cols], p.exp_avg_sq[:, cols] = master, m, v

    def _windowed_step(self, raw, used, grad_sizes, lrs):
        if self.steps_in_window == 0:  # a window starts at this step
            self.window_index += 1
            period = self.selection_period()
            due = self.window_index == 1 or (
                period is not None and self.t - self.last_selection_step >= period
            )
            if due:
                self.flush()
                self._select(raw)
            if self.window_index == 1 and self.t > 1:
                self._moments_to_windows()
            for i in range(len(self.params)):
                self.window_score[i] = None
                self.energy_selected[i] = 0.0
                self.energy_deferred[i] = 0.0

        for i, (p, g_raw, g) in enumerate(zip(self.params, raw, used)):
            lr = lrs[p.group]
            if not p.matrix:
                self._adamw_all(p, g, lr)
                continue
            c = np.sum(g_raw * g_raw, axis=0)
            self.window_score[i] = c if self.window_score[i] is None else self.window_score[i] + c
            sel, unsel = p.selected, p.deferred()
            norms = np.sqrt(c)
            self.energy_selected[i] += float(np.sum(norms[sel]))
            self.energy_deferred[i] += float(np.sum(norms[unsel]))
            self._adamw_columns(p, sel, g[:, sel], lr)
            p.weights[:, sel] = p.master[:, sel]
            p.accum[:, unsel] += g[:, unsel]
            self.counters["bytes_down"] += p.rows * len(unsel) * grad_sizes[i]
        self.steps_accumulated += 1
        self.last_accumulated_lrs = list(lrs)
        self.last_accumulated_hparams = self.hyperparameters()
        self.steps_in_window += 1

        if self._window_closes():
            self._close_window()
        elif (
            self.config["overlap_step"]
            and self.pending is not None
            and self.config["update_lag"] != "window"
            and self.steps_in_window == self.config["update_lag"]
        ):
            self._write(self.pending)  # update_lag steps into the next window
            self.pending = None

    def _window_closes(self) -> bool:
        cfg = self.config
        if cfg["update_interval"] != "auto":
            return self.steps_in_window == cfg["update_interval"]
        if self.steps_in_window >= cfg["max_update_interval"]:
            return True
        counted = due = 0
        for i, p in enumerate(self.params):
            if not p.matrix or p.k == 0 or p.k == p.cols:
                continue
            counted += 1
            e_sel = self.energy_selected[i] / (p.k * self.steps_in_window)
            e_def = self.energy_deferred[i] / (p.cols - p.k)
            self.auto_ratios.append((self.t, i, e_def / e_sel if e_sel > 0 else math.inf))
            due += e_def >= e_sel
        return counted > 0 and due / counted >= cfg["auto_ratio"]

    def _select(self, raw):
        window = self.config["selection_score"] == "window"
        for i, (p, g_raw) in enumerate(zip(self.params, raw)):
            if not p.matrix:
                continue
            if window and self.previous_window_score[i] is not None:
                score = self.previous_window_score[i]
            else:
                score = np.sum(g_raw * g_raw, axis=0)
            p.selected = topk_columns(score, p.k)
            if 0 < p.k < p.cols:
                ranked = np.sort(score)[::-1]
                top = ranked[p.k - 1]
                self.selection_gaps.append((top - ranked[p.k]) / top if top > 0 else 0.0)
        if self.last_selection_step is not None:
            self.counters["reselections"] += 1
        self.last_selection_step = self.t
        self.selection_steps.append(self.t)

    def _host_update(self):
        """The window's host AdamW on the deferred columns: A / steps_accumulated, the lr of
        the last accumulated step. Returns the results to write into the parameters."""
        results = []
        for p in self.params:
            if not p.matrix:
                continue
            unsel = p.deferred()
            if len(unsel) == 0:
                continue
            g = p.accum[:, unsel] / self.steps_accumulated
            lr = self.last_accumulated_lrs[p.group]
            span = 1 if self.config["window_scaling"] == "none" else self.steps_accumulated
            self._adamw_columns(p, unsel, g, lr, self.last_accumulated_hparams, span)
            p.accum[:, unsel] = 0.0
            results.append((p, unsel, p.master[:, unsel].copy()))
        self.steps_accumulated = 0
        return results

    def _write(self, results):
        for p, cols, values in results:
            p.weights[:, cols] = values
            self.counters["bytes_up"] += p.rows * len(cols) * p.itemsize

    def _close_window(self):
        if self.config["overlap_step"] and self.pending is not None:
            self._write(self.pending)
            self.pending = None
        if self.steps_accumulated > 0:
            self.counters["windows"] += 1
            results = self._host_update()
            if self.config["overlap_step"]:
                self.pending = results
            else:
                self._write(results)
        self.previous_window_score = list(self.window_score)
        self.steps_in_window = 0

    def flush(self):
        if self.pending is not None:
            self._write(self.pending)
            self.pending = None
        if self.steps_accumulated > 0:
            self.counters["windows"] += 1
            self._write(self._host_update())
