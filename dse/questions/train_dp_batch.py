"""How small a batch per data-parallel replica before the data-parallel traffic dominates.

The space crosses the chip, the data-parallel degree ``layout.dp`` and the global batch
``training.global_batch_seqs`` (the rest of the layout fixed in the base design). A design's
exposed data-parallel communication is measured against the same design without data
parallelism: the same replica (layout, micro-batches per step) at ``dp = 1`` with the batch
``global / dp``; everything but the data-parallel collectives is then the same, so

    dp_exposed_s = (step - optimizer)(dp, global) - (step - optimizer)(1, global / dp)

(the optimizer's update is sharded by ZeRO over dp, so it is taken out of both). Its share of
the step falls as the batch per replica grows (more micro-batches share one gradient
reduction). Per chip and dp: the batch where the share crosses ``[answer] share`` (log
interpolation between the grid's batches; None where it never does), the batch where tokens/s
per GPU come within ``[answer] plateau`` of the chip's best in the space, and for each global
batch the largest dp whose share stays under ``share``. The headline gives them at
``[answer] dp`` (the share hardly depends on dp: a ring all-reduce's time does not).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.questions.common import Picks, dress, fmt, md_table, save, subplots
from dse.questions.context import Answer, Context, Lead
from dse.questions.train_common import feasible

DP, BATCH, CHIP = "layout.dp", "training.global_batch_seqs", "accelerator.id"
METRIC = "tokens_per_s_per_chip"


def answer(ctx: Context) -> Answer:
    s = Picks(share=float(ctx.param("share", 0.5)), plateau=float(ctx.param("plateau", 0.95)),
              dp=int(ctx.param("dp", 256)))
    s.df = dp_shares(ctx)
    s.chips = list(dict.fromkeys(s.df[CHIP]))
    s.cross = crossings(s.df, s.share, s.plateau)
    s.feed = largest_dp(s.df, s.share)
    nums = _numbers(s)
    return Answer(_headline(s, nums), _details(ctx, s), nums,
                  _figures(ctx, s) if ctx.sample is None else [], _lead(s))


def dp_shares(ctx: Context) -> pd.DataFrame:
    """The feasible designs with ``dp_exposed_s`` and ``dp_share`` (of the step) and the batch
    per replica ``per_replica_seqs``."""
    df = ctx.score()
    df = df[feasible(ctx, df)].reset_index(drop=True)
    if CHIP not in df:
        df[CHIP] = ctx.space.base["accelerator.id"]
    vals = {p.path: df[p.path].to_numpy() for p in ctx.space.parameters}
    vals[DP] = np.ones(len(df), dtype=df[DP].to_numpy().dtype)
    vals[BATCH] = (df[BATCH] // df[DP]).to_numpy()
    one = ctx.score(values=vals)
    busy = (df["step_time_s"] - df["optimizer_s"]).to_numpy()
    alone = (one["step_time_s"] - one["optimizer_s"]).to_numpy()
    df["dp_exposed_s"] = np.maximum(busy - alone, 0.0)
    df["dp_share"] = df["dp_exposed_s"] / df["step_time_s"]
    df["per_replica_seqs"] = df[BATCH] / df[DP]
    return df


def _cross(x: np.ndarray, y: np.ndarray, level: float):
    """The x (log-interpolated) where the decreasing y first falls to ``level`` or below;
    None where it is below at the smallest x (no crossing in the grid) or never gets there."""
    if y[0] <= level or y[-1] > level:
        return None
    i = int(np.argmax(y <= level))
    lx = np.log(x[i - 1]) + (level - y[i - 1]) / (y[i] - y[i - 1]) * (np.log(x[i]) -
                                                                        np.log(x[i - 1]))
    return float(np.exp(lx))


def crossings(df: pd.DataFrame, share: float, plateau: float) -> pd.DataFrame:
    """Per chip and dp: the share at one sequence per replica (the grid's smallest), the batch
    per replica where it crosses ``share``, and where tokens/s per GPU reach ``plateau`` of
    their best."""
    rows = []
    best = df.groupby(CHIP)[METRIC].max()
    for (chip, dp), g in df.groupby([CHIP, DP], sort=False):
        g = g.sort_values(BATCH)
        x = g["per_replica_seqs"].to_numpy(float)
        y = g["dp_share"].to_numpy(float)
        t = g[METRIC].to_numpy(float)
        near = t >= plateau * best[chip]
        rows.append({"chip": chip, "dp": int(dp), "smallest_per_replica": float(x[0]),
                     "share_at_smallest": float(y[0]),
                     "crossing_per_replica_seqs": _cross(x, y, share),
                     "plateau_per_replica_seqs": float(x[int(np.argmax(near))]) if near.any()
                     else None,
                     "best_tokens_per_s_per_chip": float(t.max())})
    return pd.DataFrame(rows)


def largest_dp(df: pd.DataFrame, share: float) -> pd.DataFrame:
    """Per chip and global batch: the largest dp whose step keeps the DP share <= ``share``."""
    rows = []
    for (chip, b), g in df.groupby([CHIP, BATCH], sort=False):
        ok = g[g["dp_share"] <= share]
        rows.append({"chip": chip, "global_batch_seqs": int(b),
                     "largest_dp": int(ok[DP].max()) if len(ok) else 0,
                     "largest_dp_in_grid": int(g[DP].max())})
    return pd.DataFrame(rows)


def _key(chip: str) -> str:
    return chip.replace("-", "_")


def _numbers(s) -> dict:
    out = {"dp": s.dp}
    for chip in s.chips:
        c = s.cross[(s.cross["chip"] == chip) & (s.cross["dp"] == s.dp)]
        if not len(c):
            raise ValueError(f"dp={s.dp} has no feasible design on {chip}")
        c = c.iloc[0]
        out[_key(chip)] = {
            "share_at_one_seq": float(c["share_at_smallest"]),
            "crossing_per_replica_seqs": _finite(c["crossing_per_replica_seqs"]),
            "plateau_per_replica_seqs": _finite(c["plateau_per_replica_seqs"]),
            "largest_dp_at": {f"batch{int(r.global_batch_seqs)}": int(r.largest_dp) for r in
                              s.feed[s.feed["chip"] == chip].itertuples()},
        }
    return out


def _finite(v):
    return float(v) if v is not None and np.isfinite(v) else None


def _headline(s, n) -> str:
    parts = []
    for chip in s.chips:
        x = n[_key(chip)]
        if x["crossing_per_replica_seqs"] is None:
            cross = (f"the exposed data-parallel communication never reaches {s.share:.0%} of "
                     f"the step: at one sequence per replica it is "
                     f"**{x['share_at_one_seq']:.0%}**")
        else:
            cross = (f"the exposed data-parallel communication is **"
                     f"{x['share_at_one_seq']:.0%}** of the step at one sequence per replica "
                     f"and crosses {s.share:.0%} at {fmt(x['crossing_per_replica_seqs'])} "
                     "sequences per replica (interpolated between the grid's batches)")
        plat = x["plateau_per_replica_seqs"]
        plat = (f"tokens/s per GPU come within {1 - s.plateau:.0%} of the chip's best from "
                f"**{fmt(plat)} sequences per replica** on" if plat is not None else
                f"tokens/s per GPU never come within {1 - s.plateau:.0%} of the chip's best")
        parts.append(f"On {chip} at dp={s.dp}, {cross}; {plat}.")
    return (" ".join(parts) + " The gradient reduction is one collective per step, hidden "
            "under the last micro-batch's forward and backward (the training fit's "
            "`overlap_fraction`), so what is exposed is the reduction's time over one "
            "micro-batch's compute, spread over the micro-batches of a step: the share falls "
            "as 1 / (sequences per replica), not with dp (a ring's time hardly depends on dp). "
            "A global batch therefore feeds dp up to batch / (sequences per replica at the "
            "plateau) before tokens/s per GPU fall off: "
            + "; ".join(f"{c}: dp <= {fmt(2048 / n[_key(c)]['plateau_per_replica_seqs'])} at "
                        "2,048 sequences" for c in s.chips
                        if n[_key(c)]["plateau_per_replica_seqs"]) + ".")


def _details(ctx, s) -> str:
    def txt(v, none):
        return none if _finite(v) is None else fmt(v)
    rows = [[r.chip, r.dp, r.share_at_smallest, txt(r.crossing_per_replica_seqs, "never"),
             txt(r.plateau_per_replica_seqs, "not in the grid"), r.best_tokens_per_s_per_chip]
            for r in s.cross.itertuples()]
    feed = s.feed.pivot(index="global_batch_seqs", columns="chip", values="largest_dp")
    frows = [[int(b), *[str(int(v)) if v else "none" for v in feed.loc[b]]]
             for b in feed.index]
    return (
        "## Method\n\n"
        f"Every design of the space ({ctx.space.size:,}: chip x dp x global batch; the rest of "
        "the layout fixed) is scored by the training model, and again at dp = 1 with the batch "
        "of one replica: the difference of the two steps (the optimizer's update taken out) is "
        "the exposed data-parallel communication. The terms that set it: the ZeRO-1 gradient "
        "reduce-scatter and parameter all-gather (one all-reduce's bytes of the bf16 "
        "parameters a chip holds, on the scale-out NICs: tp = 8 fills the node), the part of "
        "it that one micro-batch's forward and backward hide (`overlap_fraction`), and the "
        "step's micro-batches (batch per replica / micro-batch).\n\n"
        f"## Per chip and dp (share crossing {s.share:.0%}, plateau {s.plateau:.0%} of the "
        "best)\n\n"
        + md_table(["chip", "dp", "DP share at 1 seq/replica", "crossing [seqs/replica]",
                    "plateau from [seqs/replica]", "best tokens/s per GPU"], rows)
        + f"\n\n## Largest dp per global batch with the DP share <= {s.share:.0%}\n\n"
        + md_table(["global batch [seqs]", *feed.columns], frows) + "\n")


def _figures(ctx, s) -> list[str]:
    fig, axes = subplots(1, 2, figsize=(12, 4.5))
    for chip, ls in zip(s.chips, ("-", "--", ":")):
        d = s.df[s.df[CHIP] == chip]
        for dp, g in d.groupby(DP):
            if dp not in (16, 256, 2048):
                continue
            g = g.sort_values("per_replica_seqs")
            axes[0].plot(g["per_replica_seqs"], g["dp_share"] * 100, ls, marker="o", ms=3,
                         label=f"{chip} dp={dp}")
            axes[1].plot(g["per_replica_seqs"], g[METRIC], ls, marker="o", ms=3,
                         label=f"{chip} dp={dp}")
    axes[0].axhline(s.share * 100, color="grey", lw=0.8)
    dress(axes[0], "batch per data-parallel replica [sequences]",
          "exposed DP communication [% of the step]", "DP share of the step", xlog=2, legend=7)
    dress(axes[1], "batch per data-parallel replica [sequences]",
          "throughput per GPU [tokens/s]", "Tokens/s per GPU", xlog=2, legend=7)
    return [save(fig, ctx, "dp_share.png")]


def _lead(s) -> tuple:
    out = []
    for chip in s.chips:
        k = _key(chip)
        out.append(Lead(f"{k}.share_at_one_seq", f"{chip}, dp={s.dp}: exposed DP share of "
                        "the step at one sequence per replica", "share", versus=s.share))
        out.append(Lead(f"{k}.plateau_per_replica_seqs", f"{chip}, dp={s.dp}: sequences per "
                        "replica where tokens/s per GPU stop improving", "sequences"))
    return tuple(out)
