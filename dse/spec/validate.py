"""One validation layer for every input, derived from the field registry (``dse.spec.fields``).

- ``check_value``: one value as a file gives it (TOML, JSON, a parsed ``--set``): its type
  (a bool, a blank, ``nan`` or ``inf`` is never a number), then its range;
- ``parse_text``: a value written as text (``--set PATH=VALUE``) into its type, then checked;
- ``parse_column``: a column of strings or objects (a case CSV, a design table) into numbers,
  refusing the values that are not numbers of that field;
- ``check_table``: every field of a resolved design table (catalog values and overrides), then
  the consistency rules between fields (``CONSISTENCY``);
- ``typo_columns``: a case file's column that is one edit away from a known one;
- ``field_part_columns``: a case file's column named like a field's last part (or one edit
  from it), which would be ignored: it names the dotted path meant.

Every failure is an ``InputError``: one line naming the file, the key (or row and column) and
what is valid; the CLI exits 2.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dse import catalog
from dse.errors import InputError, suggest
from dse.spec.fields import LIMITS, REGISTRY, Field

TRUE_WORDS, FALSE_WORDS = ("true", "yes"), ("false", "no")


def _range_bad(f: Field, v: np.ndarray) -> np.ndarray:
    """Per value: not finite, outside the field's range, or not a whole number for a count.
    NaN counts as bad (blank values are handled before)."""
    bad = ~np.isfinite(v)
    with np.errstate(invalid="ignore"):
        if f.low is not None:
            bad |= (v <= f.low) if f.low_open else (v < f.low)
        if f.upper is not None:
            bad |= v > f.upper
        if f.kind in ("int", "bool"):
            bad |= v != np.round(v)
    return bad


def _show(v) -> str:
    if isinstance(v, float):
        return "inf" if v == math.inf else "-inf" if v == -math.inf else "nan" if v != v else f"{v:g}"
    return repr(v)


def check_value(path: str, value, *, file=None, where=None, name=None, registry=None):
    """One value of ``path`` as a file gives it; returns it (strings stripped). ``registry``:
    the fields to check against (default: the serving fields, ``fields.REGISTRY``; a training
    space passes ``train_fields.REGISTRY``)."""
    registry = REGISTRY if registry is None else registry
    f = registry.get(path)
    if f is None:
        raise InputError(f"unknown key {path!r}", file=file, where=where,
                         hint=suggest(path, registry, "valid keys"))
    name = name or path
    if isinstance(value, (list, dict, tuple)):
        raise InputError(f"{name} must be a single value, not a {type(value).__name__}",
                         file=file, where=where, hint=f.valid())
    if f.kind in ("enum", "id"):
        if not isinstance(value, str):
            raise InputError(f"{name} = {_show(value)} is not valid: it must be a string",
                             file=file, where=where, hint=f.valid())
        v = value.strip()
        if v == "" and not f.blank:
            raise InputError(f"{name} is blank", file=file, where=where, hint=f.valid())
        if f.kind == "enum" and v != "" and v not in f.choices:
            raise InputError(f"{name} = {value!r} is not valid", file=file, where=where,
                             hint=suggest(v, f.choices, "one of"))
        return v
    if f.kind == "bool":
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return bool(value)
        raise InputError(f"{name} = {_show(value)} is not valid", file=file, where=where,
                         hint=f.valid())
    if isinstance(value, bool) or isinstance(value, np.bool_):
        raise InputError(f"{name} = {str(value).lower()} is not a number", file=file, where=where,
                         hint=f.valid())
    if isinstance(value, str):
        what = "is blank" if value.strip() == "" else f"= {value!r} is not a number"
        raise InputError(f"{name} {what}", file=file, where=where, hint=f.valid())
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} = {value!r} is not a number", file=file, where=where,
                         hint=f.valid())
    if _range_bad(f, np.array([float(value)]))[0]:
        raise InputError(f"{name} = {_show(value)} is not valid", file=file, where=where,
                         hint=f.valid())
    return value


def parse_text(path: str, text: str, *, file=None, where=None, name=None, registry=None,
               ids=None):
    """A value written as text (``--set PATH=VALUE``) as its field's type, checked.
    ``registry``: the fields (default the serving ones); ``ids(path)``: the valid ids of an id
    field (default the serving catalog's table)."""
    registry = REGISTRY if registry is None else registry
    f = registry.get(path)
    if f is None:
        raise InputError(f"unknown path {path!r}", file=file, where=where,
                         hint=suggest(path, registry, "valid paths"))
    t = text.strip()
    if f.kind == "bool" and t.lower() in (*TRUE_WORDS, *FALSE_WORDS, "0", "1"):
        return check_value(path, t.lower() in (*TRUE_WORDS, "1"), file=file, where=where, name=name,
                           registry=registry)
    if f.numeric:
        try:
            v = int(t) if t.lstrip("+-").isdigit() else float(t)
        except ValueError:
            v = t      # not a number: check_value says so
        if isinstance(v, float) and t.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            v = float(t)
        return check_value(path, v, file=file, where=where, name=name, registry=registry)
    v = check_value(path, t, file=file, where=where, name=name, registry=registry)
    if f.kind == "id" and not (v == "" and f.blank):
        kind = catalog_kind(path)
        ids = catalog.table(kind) if ids is None else ids(path)
        if v not in ids:
            raise InputError(f"{name or path} = {v!r} is not a catalog id", file=file,
                             where=where, hint=suggest(v, ids, "ids")
                             + f" (see `dse catalog list {kind}`)")
    return v


CATALOG_KINDS = {"accelerator": "accelerators", "topology": "topologies", "model": "models"}
# id fields outside those sections: the catalog table they name
CATALOG_OF = {"serving.spec_draft_model": "models"}


def catalog_kind(path: str) -> str:
    """The catalog table (``dse catalog list KIND``) an id field's values come from."""
    return CATALOG_OF.get(path) or CATALOG_KINDS[path.split(".", 1)[0]]


def parse_column(path: str, column: pd.Series, *, file=None, names=None, name=None) -> pd.Series:
    """A column of ``path`` (strings from a CSV, or Python values) as floats; blanks (NaN, None,
    "") stay NaN. Values that are not numbers of this field are refused.

    A column of strings (a case file's) is parsed once per distinct value: a CSV column holds
    few (lengths, counts), and the result of a value never depends on its neighbours."""
    f = REGISTRY[path]
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        num = column.astype(float)                 # already numbers: only infinities to refuse
        inf = np.isinf(num.to_numpy())
        if inf.any():
            i = int(np.flatnonzero(inf)[0])
            raise InputError(f"{name or path} = {num.iloc[i]!r} is not a number", file=file,
                             where=names[i] if names else None, hint=f.valid())
        return num
    if len(column) > 1 and pd.api.types.infer_dtype(column, skipna=True) in ("string", "empty"):
        # (strings only: factorize would take True, 1 and 1.0 for one value)
        codes, uniques = pd.factorize(column)          # a blank (NaN, None): code -1
        values = pd.Series([*np.asarray(uniques, dtype=object), np.nan], dtype=object)
        u_num, u_bad = _parse_values(f, values)
        num = pd.Series(u_num[codes], index=column.index, name=column.name)
        bad = u_bad[codes]
    else:
        num, bad = _parse_values(f, column)
        num = pd.Series(num, index=column.index, name=column.name)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        v = column.astype(object).iloc[i]
        shown = str(v).lower() if isinstance(v, (bool, np.bool_)) else repr(v)
        raise InputError(f"{name or path} = {shown} is not a number", file=file,
                         where=names[i] if names else None, hint=f.valid())
    return num


def to_numeric(column: pd.Series, errors: str = "raise") -> pd.Series:
    """``pd.to_numeric(column, errors=errors)``, the same values and dtype, converted once per
    distinct string where the column holds strings (a case column: 50,000 cells, a few
    values); any other column as pandas converts it."""
    if len(column) > 1 and pd.api.types.infer_dtype(column, skipna=True) == "string":
        codes, uniques = pd.factorize(column)            # a blank: code -1
        u = pd.to_numeric(pd.Series(np.asarray(uniques, dtype=object), dtype=object),
                          errors=errors).to_numpy()
        if (codes < 0).any():                            # blanks make it float, as pandas does
            u = np.append(u.astype(float), np.nan)
        return pd.Series(u[codes], index=column.index, name=column.name)
    return pd.to_numeric(column, errors=errors)


def _parse_values(f: Field, column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``parse_column``'s work on any column: (floats, NaN where blank; per value, not a
    number of the field)."""
    obj = column.astype(object)
    blank = obj.isna() | obj.map(lambda x: isinstance(x, str) and x.strip() == "")
    if f.kind == "bool":
        obj = obj.map(lambda x: (x.strip().lower() in (*TRUE_WORDS, "1")) if isinstance(x, str)
                      and x.strip().lower() in (*TRUE_WORDS, *FALSE_WORDS) else x)
        is_bool = pd.Series(False, index=obj.index)
    else:
        is_bool = obj.map(lambda x: isinstance(x, (bool, np.bool_)))
    num = pd.to_numeric(obj.where(~(blank | is_bool), np.nan), errors="coerce")
    if f.kind == "bool":
        num = pd.to_numeric(obj.where(~blank, np.nan).map(
            lambda x: float(x) if isinstance(x, (bool, np.bool_)) else x), errors="coerce")
    text = obj.astype(str).str.strip().str.lower()
    bad = (~blank & (num.isna() | is_bool)) | text.isin(("nan", "inf", "-inf", "+inf", "infinity"))
    return num.to_numpy(dtype=float), bad.to_numpy(dtype=bool)


def check_table(out, *, file=None, names=None, alias=None, columns=None, rules=True) -> None:
    """Every registered field of a resolved design table (a DataFrame or a dict of arrays) in
    its range, then the consistency rules (``rules``; off: the ranges of some columns only)."""
    alias = alias or {}
    n = max((np.size(out[c]) for c in out.keys()), default=0) if not hasattr(out, "columns") \
        else len(out)

    def where(i):
        return names[i] if names is not None and i < len(names) else (f"design {i}" if n > 1 else None)

    for col in (columns if columns is not None else list(out.keys())):
        f = REGISTRY.get(col)
        if f is None or not f.resolved:
            continue
        vals = out[col]
        if f.kind in ("enum", "id"):
            if f.kind == "id":
                continue            # ids are checked against the catalog when they are joined
            s = pd.Series(np.asarray(vals, dtype=object)).fillna("").astype(str)
            ok = s.isin(f.choices) | ((s == "") & bool(f.blank))
            if not ok.all():
                i = int(np.flatnonzero(~ok.to_numpy())[0])
                raise InputError(f"{alias.get(col, col)} = {s.iloc[i]!r} is not valid", file=file,
                                 where=where(i), hint=suggest(s.iloc[i], f.choices, "one of"))
            continue
        v = np.asarray(pd.to_numeric(pd.Series(np.asarray(vals).ravel()), errors="coerce"),
                       dtype=float)
        bad = _range_bad(f, v)
        if f.catalog_absent:
            bad &= ~np.isnan(v)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{alias.get(col, col)} = {_show(float(v[i]))} is not valid",
                             file=file, where=where(i), hint=f.valid())
    if rules:
        consistency(out, file=file, where=where, alias=alias)


def _rules(g):
    """(bad rows, message, hint) of every consistency rule; ``g(path)`` is a float array."""
    L, nh, nkv = g("model.num_hidden_layers"), g("model.num_attention_heads"), \
        g("model.num_key_value_heads")
    E, k = g("model.num_experts"), g("model.num_experts_per_tok")
    first, step = g("model.first_k_dense_replace"), g("model.moe_layer_step")
    moe = E > 0
    n_moe = np.where(moe & (step > 0), np.floor((L - first) / np.maximum(step, 1)), 0)
    mla = g("model.kv_lora_rank") > 0
    local = g("model.num_local_attention_layers")
    chips = g("layout.tp") * g("layout.pp") * g("layout.dp")
    lim = LIMITS["chips per instance"]
    tpx = np.nan_to_num(g("layout.tp_x"), nan=1.0)
    return [
        (nkv > nh, "model.num_key_value_heads = {model.num_key_value_heads} exceeds num_attention_heads "
         "= {model.num_attention_heads}", "KV heads are at most the attention heads"),
        (~mla & (np.mod(nh, np.maximum(nkv, 1)) != 0), "num_attention_heads = "
         "{model.num_attention_heads} is not a multiple of num_key_value_heads = "
         "{model.num_key_value_heads}", "every KV head serves the same number of query heads"),
        (moe & ((k < 1) | (k > E)), "model.num_experts_per_tok = {model.num_experts_per_tok} is not "
         "between 1 and model.num_experts = {model.num_experts}", "an MoE routes each token to 1..E "
         "experts"),
        (moe & (g("model.moe_intermediate_size") < 1), "an MoE model (num_experts = "
         "{model.num_experts}) needs moe_intermediate_size >= 1", "the width of one expert"),
        (moe & (step < 1), "an MoE model (model.num_experts = {model.num_experts}) needs moe_layer_step "
         ">= 1", "1 = every layer after the dense ones is MoE"),
        (moe & (L < first), "model.num_hidden_layers = {model.num_hidden_layers} is fewer than "
         "model.first_k_dense_replace = {model.first_k_dense_replace} dense layers",
         "num_hidden_layers >= first_k_dense_replace"),
        ((L - n_moe > 0) & (g("model.intermediate_size") < 1), "the model has dense layers but "
         "model.intermediate_size = {model.intermediate_size}", "give the dense FFN width"),
        (moe & (g("model.n_shared_experts") > 0) & (g("model.shared_expert_intermediate_size") < 1),
         "model.n_shared_experts = {model.n_shared_experts} but shared_expert_intermediate_size = 0",
         "give the width of one shared expert, or n_shared_experts = 0"),
        (local > L, "model.num_local_attention_layers = {model.num_local_attention_layers} exceeds "
         "model.num_hidden_layers = {model.num_hidden_layers}", "at most every layer is local"),
        ((local > 0) & (g("model.sliding_window") < 1), "num_local_attention_layers = "
         "{model.num_local_attention_layers} needs sliding_window >= 1", "the local window"),
        (mla & ((g("model.qk_nope_head_dim") < 1) | (g("model.qk_rope_head_dim") < 1)
                | (g("model.v_head_dim") < 1)),
         "an MLA model (model.kv_lora_rank = {model.kv_lora_rank}) needs qk_nope_head_dim, "
         "qk_rope_head_dim and v_head_dim >= 1", "the MLA head dimensions"),
        (chips > lim, "tp*pp*dp = {chips:.0f} chips per instance", f"at most {lim:,}; "
         "limit: chips per instance"),
        (np.mod(g("layout.tp"), tpx) != 0,
         ("layout.tp_x = {layout.tp_x} does not divide layout.tp = {layout.tp}"),
         "the 2D weight-stationary mesh is tp_x x (tp / tp_x) chips"),
        ((tpx > 1) & ((E > 0) | (g("layout.dp") > 1)),
         ("layout.tp_x = {layout.tp_x} (2D weight-stationary tp) with num_experts = "
          "{model.num_experts}, dp = {layout.dp}"),
         "2D weight-stationary tp is modelled for dense models with dp = 1; use layout.tp_x = 1"),
        ((tpx > 1) & (g("layout.prefill_tp") > 0) & (np.mod(g("layout.prefill_tp"), tpx) != 0),
         "layout.tp_x = {layout.tp_x} does not divide layout.prefill_tp = {layout.prefill_tp}",
         "the prefill pool runs the same 2D mesh: give a prefill_tp that tp_x divides"),
    ]


def consistency(out, *, file=None, where=lambda i: None, alias=None) -> None:
    """Refuse a design whose fields contradict each other (the first rule a row breaks)."""
    alias = alias or {}
    have = set(out.keys())

    def g(path):
        if path not in have:
            return np.array([np.nan])
        return np.asarray(pd.to_numeric(pd.Series(np.asarray(out[path]).ravel()),
                                        errors="coerce"), dtype=float)

    cache = {}

    def gc(path):
        if path not in cache:
            cache[path] = g(path)
        return cache[path]

    for bad, msg, hint in _rules(gc):
        bad = np.asarray(bad, dtype=bool)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            vals = {p: (a[i] if a.size > 1 else a[0]) for p, a in cache.items()}
            vals["chips"] = (vals.get("layout.tp", 1) * vals.get("layout.pp", 1)
                             * vals.get("layout.dp", 1))
            text = msg
            for p, x in vals.items():
                text = text.replace("{" + p + "}", f"{x:g}")
            text = text.replace("{chips:.0f}", f"{vals['chips']:.0f}")
            raise InputError(text, file=file, where=where(i), hint=hint)
    _domain_limits(out, file, where)


def _domain_limits(out, file, where) -> None:
    """A full mesh has an edge per pair of chips: its domain has a smaller cap."""
    if "topology.id" not in out.keys() or "topology.scaleup.domain_chips" not in out.keys():
        return
    topos = catalog.topologies()
    mesh = [t for t, spec in topos.items() if spec.kind == "full_mesh"]
    ids = pd.Series(np.asarray(out["topology.id"], dtype=object).ravel()).astype(str)
    dom = np.asarray(out["topology.scaleup.domain_chips"], dtype=float).ravel()
    lim = LIMITS["full-mesh domain chips"]
    bad = ids.isin(mesh).to_numpy() & (np.broadcast_to(dom, ids.shape) > lim)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"topology.scaleup.domain_chips = {np.broadcast_to(dom, ids.shape)[i]:g} "
                         f"on the full mesh {ids.iloc[i]!r}", file=file, where=where(i),
                         hint=f"at most {lim:,}; limit: full-mesh domain chips")


def osa_distance_is_one(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` are one edit apart: a character missing, extra, changed, or two
    adjacent characters swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    return a[i:] == b[i + 1:]


def typo_columns(columns, known, *, file=None) -> None:
    """Refuse a column of six or more characters one edit away from a known column."""
    known = tuple(known)
    for c in columns:
        c = str(c)
        if c in known or len(c) < 6:
            continue
        near = [k for k in known if osa_distance_is_one(c, k)]
        if near:
            raise InputError(f"unknown column {c!r} looks like a typo of {near[0]!r}", file=file,
                             where=f"header, column {c}", hint=f"rename it to {near[0]!r}; an extra column "
                             "needs a name that is not one edit from a known one")


def field_part_columns(columns, allowed, *, file=None) -> None:
    """Refuse a column that is not ``allowed`` but is named like a field's last dotted part
    (``hbm_bw_bytes_per_s``), or six or more characters one edit from one: a case file sets a
    field by its dotted path (``accelerator.hbm_bw_bytes_per_s``), so the column would be
    silently ignored as an extra one."""
    allowed = set(allowed)
    parts: dict[str, list[str]] = {}
    for path in REGISTRY:
        parts.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    for c in map(str, columns):
        if c in allowed or "." in c:
            continue
        meant = parts.get(c) or [p for k, ps in parts.items() if len(c) >= 6
                                 and osa_distance_is_one(c, k) for p in ps]
        if meant:
            shown = " or ".join(repr(p) for p in sorted(meant)[:3])
            raise InputError(f"column {c!r} would be ignored: a field is set by its dotted "
                             "path", file=file, where=f"header, column {c}",
                             hint=f"rename it to {shown}; an extra column needs a name that "
                             "is not a field's")


def range_bad(path: str, values: np.ndarray) -> np.ndarray:
    """Per value of ``path``: outside its range (NaN counts as bad)."""
    return _range_bad(REGISTRY[path], np.asarray(values, dtype=float))


def check_values(path: str, values, *, file=None, where=None, registry=None) -> tuple:
    """A list of values of ``path`` (a space's parameter): checked at numpy speed when all are
    plain numbers, else one by one (``check_value``); returns them as a tuple."""
    f = (REGISTRY if registry is None else registry).get(path)
    plain = f is not None and f.kind in ("int", "float") and all(
        type(v) in (int, float) for v in values)
    if plain:
        bad = _range_bad(f, np.asarray(values, dtype=float))
        if not bad.any():
            return tuple(values)
        values = [values[int(np.flatnonzero(bad)[0])]]
    return tuple(check_value(path, v, file=file, where=where, registry=registry)
                 for v in values)
