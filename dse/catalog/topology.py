"""Topologies as networkx graphs, reduced once to the per-tier numbers the scorer uses.

Capacities are relative to one chip's scale-up injection bandwidth (= 1.0), so a reduction is
shared by every accelerator placed in the same graph. For a group of ``g`` chips placed
contiguously (a compact sub-block on a torus) the reduction gives

- ``ar_fraction``: the share of injection bandwidth an all-reduce over the group can use,
  ``min(mean link capacity into the group, 2 * bisection)``;
- ``a2a_fraction``: the same for a uniform all-to-all, ``min(local, 4 * bisection / g)``;
- ``hops``: mean shortest-path hops between two chips of the group.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx
import numpy as np

from dse.catalog.specs import Topology


def torus_dims(domain_chips: int, axes: int) -> tuple[int, ...]:
    """The most balanced factorisation of ``domain_chips`` into ``axes`` factors (largest last)."""
    best = None
    divisors = [d for d in range(1, domain_chips + 1) if domain_chips % d == 0]
    for combo in itertools.combinations_with_replacement(divisors, axes - 1):
        rest = domain_chips
        for c in combo:
            if rest % c:
                break
            rest //= c
        else:
            dims = tuple(sorted((*combo, rest)))
            key = (max(dims), dims)
            if best is None or key < best[0]:
                best = (key, dims)
    return best[1]


def build_graph(topo: Topology, domain_chips: int) -> nx.Graph:
    """The scale-up domain as a graph: nodes ("chip", i) and switches, edge ``capacity``."""
    g = nx.Graph()
    chips = [("chip", i) for i in range(domain_chips)]
    g.add_nodes_from(chips)

    def link(u, v, cap):
        if g.has_edge(u, v):
            g[u][v]["capacity"] += cap
        else:
            g.add_edge(u, v, capacity=cap)

    if topo.kind == "switched":
        for s in range(topo.switch_planes):
            for c in chips:
                link(c, ("switch", s), 1.0 / topo.switch_planes)
    elif topo.kind == "full_mesh":
        for a, b in itertools.combinations(chips, 2):
            link(a, b, 1.0 / max(domain_chips - 1, 1))
    elif topo.kind == "pcie_tree":
        root = ("root", 0)
        n_sw = -(-domain_chips // topo.chips_per_switch)
        for s in range(n_sw):
            link(("switch", s), root, topo.uplink_bw_fraction)
        for i, c in enumerate(chips):
            link(c, ("switch", i // topo.chips_per_switch), 1.0)
    elif topo.kind == "torus":
        dims = torus_dims(domain_chips, topo.torus_axes)
        weights = list(topo.axis_bw_weights) or [1.0] * len(dims)
        weights = (weights + [weights[-1]] * len(dims))[: len(dims)]
        active = [(n, w) for n, w in zip(dims, weights) if n > 1]
        per_link = 1.0 / sum(2.0 * w for _, w in active) if active else 1.0
        for idx in np.ndindex(*dims):
            u = ("chip", int(np.ravel_multi_index(idx, dims, order="F")))
            for ax, n in enumerate(dims):
                if n == 1:
                    continue
                nxt = list(idx)
                nxt[ax] = (idx[ax] + 1) % n
                v = ("chip", int(np.ravel_multi_index(tuple(nxt), dims, order="F")))
                if n == 2 and idx[ax] == 1:
                    continue  # the same pair once; both directions of a 2-long axis
                link(u, v, weights[ax] * per_link * (2.0 if n == 2 else 1.0))
    else:  # pragma: no cover - the spec's Literal rejects other kinds
        raise ValueError(topo.kind)
    return g


@dataclass(frozen=True)
class Reduced:
    sizes: np.ndarray
    ar_fraction: np.ndarray
    a2a_fraction: np.ndarray
    hops: np.ndarray

    def at(self, g: np.ndarray, which: str) -> np.ndarray:
        """Values for group sizes ``g`` (log2-interpolated; clipped to the domain)."""
        x = np.log2(np.maximum(np.asarray(g, dtype=float), 1.0))
        return np.interp(x, np.log2(self.sizes), getattr(self, which))


def _group_numbers(graph: nx.Graph, group: list) -> tuple[float, float, float]:
    members = set(group)
    sub_nodes = members | {n for n in graph.nodes if n[0] != "chip"}
    sub = graph.subgraph(sub_nodes)
    local = np.mean([sum(d["capacity"] for _, v, d in sub.edges(c, data=True)) for c in group])
    if len(group) < 2:
        return 1.0, 1.0, 0.0
    half = len(group) // 2
    flow = nx.DiGraph()
    for u, v, d in sub.edges(data=True):
        flow.add_edge(u, v, capacity=d["capacity"])
        flow.add_edge(v, u, capacity=d["capacity"])
    for c in group[:half]:
        flow.add_edge("SRC", c, capacity=float("inf"))
    for c in group[half:]:
        flow.add_edge(c, "SNK", capacity=float("inf"))
    # (rounded to 12 digits: the preflow-push algorithm visits nodes in an order that follows
    # Python's string hashing, so the last bits of its sum change from process to process)
    bisection = float(f"{nx.maximum_flow_value(flow, 'SRC', 'SNK'):.12g}")
    ar = min(local, 2.0 * bisection, 1.0)
    a2a = min(local, 4.0 * bisection / len(group), 1.0)
    rng = np.random.default_rng(0)
    sources = [group[i] for i in rng.choice(len(group), size=min(8, len(group)), replace=False)]
    dists = []
    for s in sources:
        lengths = nx.single_source_shortest_path_length(sub, s)
        dists.extend(lengths[c] for c in group if c != s and c in lengths)
    return ar, a2a, float(np.mean(dists)) if dists else 0.0


def _placement(topo: Topology, domain_chips: int, size: int) -> list:
    """The chips a group of ``size`` occupies: the first ones, or a compact block on a torus."""
    if topo.kind != "torus":
        return [("chip", i) for i in range(size)]
    dims = torus_dims(domain_chips, topo.torus_axes)
    shape = [1] * len(dims)
    left = size
    while left > 1:   # grow the block one prime factor at a time along its shortest free axis
        f = next(p for p in range(2, left + 1) if left % p == 0)
        free = [i for i in range(len(dims)) if shape[i] * f <= dims[i] and dims[i] % (shape[i] * f) == 0]
        if not free:
            return [("chip", i) for i in range(size)]
        ax = min(free, key=lambda i: (shape[i], -dims[i]))
        shape[ax] *= f
        left //= f
    return [("chip", int(np.ravel_multi_index(idx, dims, order="F"))) for idx in np.ndindex(*shape)]


@lru_cache(maxsize=256)
def reduce(topo: Topology, domain_chips: int, max_group: int) -> Reduced:
    """Reduce ``topo`` with ``domain_chips`` chips for groups of 1, 2, 4, ... up to ``max_group``."""
    top = min(max(int(max_group), 1), domain_chips)
    sizes = sorted({1, top, *[2 ** j for j in range(int(np.log2(top)) + 1)]})
    ar, a2a, hops = [], [], []
    for s in sizes:
        a, b, h = _size_numbers(topo, domain_chips, s)
        ar.append(a)
        a2a.append(b)
        hops.append(h)
    return Reduced(np.array(sizes, float), np.array(ar), np.array(a2a), np.array(hops))


@lru_cache(maxsize=1024)
def _size_numbers(topo: Topology, domain_chips: int, size: int) -> tuple[float, float, float]:
    """(all-reduce fraction, all-to-all fraction, hops) of a group of ``size`` chips: once per
    size, whatever the reductions that ask for it."""
    return _group_numbers(_graph(topo, domain_chips), _placement(topo, domain_chips, size))


@lru_cache(maxsize=64)
def _graph(topo: Topology, domain_chips: int) -> nx.Graph:
    return build_graph(topo, domain_chips)
