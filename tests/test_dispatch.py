"""The kernel contract and the machinery around it (CPU, no GPU): plans and declines, the dispatcher
and its memo of plans, the overrides, the registry, and the package's import graph.

* Every registered kernel answers ``plan(problem, device, overrides)`` with a truthy
  :class:`~cuconv.plan.Plan` (``describe()``, ``reason``) or a falsy :class:`~cuconv.plan.Declined`
  carrying its reason, on every model device, without raising.
* :func:`cuconv.dispatch.select` returns ``(plan, explanation)``, memoised per (problem, device,
  forced kernel, strategy, overrides): inside ``cuconv.overrides(block_n=...)`` the explanation
  names the forced tile, outside it the automatic one.
* ``cuconv.overrides`` / :class:`cuconv.Overrides` refuse a bad value with a ValueError naming the field.
* The registry refuses a second kernel of the same name; no module of cuconv imports itself back.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import cuconv
from cuconv import dispatch
from cuconv.device import CPU, DeviceInfo
from cuconv.overrides import Overrides, current_overrides
from cuconv.plan import Declined, KernelDeclined, Plan
from cuconv.problem import Epilogue

from geometry import A100, H100, problem2d, problem3d

ROOT = Path(__file__).resolve().parents[1]
MI300 = DeviceInfo(kind="hip", index=0, name="MI300X", arch="gfx942:sramecc+:xnack-", sm_count=304)
DEVICES = {"cpu": CPU, "h100": H100, "a100": A100, "mi300": MI300}
PROBLEMS = {
    "conv2d_bf16": problem2d(C=64, K=64),
    "conv2d_fp32": problem2d(dtype="float32"),
    "conv2d_grouped": problem2d(C=64, K=64, groups=16),
    "conv2d_depthwise": problem2d(C=48, K=96, groups=48),
    "conv3d_depthwise": problem3d(C=24, K=24, groups=24, dtype="float32"),
    "conv2d_stem": problem2d(N=1, H=32, W=32, C=3, K=64, R=7, S=7, stride=2, padding=3),
    "conv2d_patch": problem2d(N=1, H=32, W=32, C=3, K=64, R=16, S=16, stride=16, padding=0),
    "conv2d_residual": problem2d(C=64, K=128, epilogue=Epilogue(has_residual=True, has_bias=True, activation="relu")),
    "conv3d_bf16": problem3d(C=64, K=64),
    "conv3d_temporal_pad": problem3d(C=32, K=32, padding=1, dtype="float16"),
}
KERNEL_NAMES = ["cpu", "generic_gpu", "sm90_tma", "sm90_bf16x3", "conv3d_native_bf16x3", "sm90_tf32", "conv3d_native_tf32", "conv3d_native", "conv3d_qslice", "sm80_igemm", "sm80_tf32", "sm90_fold", "sm90_patch", "sm90_wpack", "conv3d_native_wpack", "sm90_grouped", "conv3d_grouped", "depthwise_direct", "depthwise_mma", "depthwise_diag", "smallc_mma",
                "smallc_direct", "narrowk_direct", "pointwise_mma", "pointwise_narrow",
                "cdna3_depthwise",
                "cdna3_igemm"]


# ----------------------------------------------------------------------------------------- the plan contract
def test_registered_kernels():
    names = [k.name for k in cuconv.kernels()]
    assert sorted(names) == sorted(KERNEL_NAMES)
    assert [k.priority for k in cuconv.kernels()] == sorted((k.priority for k in cuconv.kernels()), reverse=True)


@pytest.mark.parametrize("device", list(DEVICES), ids=list(DEVICES))
@pytest.mark.parametrize("problem", list(PROBLEMS), ids=list(PROBLEMS))
def test_every_kernel_plans_or_declines_with_a_reason(problem, device):
    p, dev = PROBLEMS[problem], DEVICES[device]
    for k in cuconv.kernels():
        answer = k.plan(p, dev, Overrides())
        if isinstance(answer, Declined):
            assert not answer and isinstance(answer.reason, str) and answer.reason, (k.name, answer)
            if dev.kind != k.backend:
                assert f"runs on {k.backend}" in answer.reason
            elif p.nd not in k.spatial_dims:
                assert "serves conv" in answer.reason
        else:
            assert isinstance(answer, Plan) and answer, (k.name, answer)
            assert answer.kernel is k and answer.problem == p and answer.device == dev
            assert answer.reason and isinstance(answer.describe(), str) and answer.describe()
            assert k.name in repr(answer) and answer.describe() == answer.describe()  # stable


@pytest.mark.parametrize("device", list(DEVICES), ids=list(DEVICES))
@pytest.mark.parametrize("problem", list(PROBLEMS), ids=list(PROBLEMS))
def test_select_explains_every_kernel(problem, device):
    """The chosen plan is the first (highest priority) that plans the problem and does not pass it over;
    every higher kernel is listed as declined with its reason (or why it passes the problem over), every
    lower one that would plan it as not needed."""
    p, dev = PROBLEMS[problem], DEVICES[device]
    answers = {k.name: k.plan(p, dev, Overrides()) for k in cuconv.kernels()}
    if not any(answers.values()):  # on a HIP device only cdna3_igemm exists (conv2d, fp16/bf16, even C/groups)
        assert dev.kind == "hip", answers
        with pytest.raises(cuconv.KernelDeclined, match="no cuconv kernel serves") as err:
            dispatch.select(p, dev)
        assert answers["cdna3_igemm"].reason in str(err.value)
        return
    plan, e = dispatch.select(p, dev)
    assert e.plan is plan and e.kernel == plan.kernel.name and e.detail == plan.describe() and e.reason == plan.reason
    assert e.problem == p and e.device == dev and not e.forced and e.overrides == current_overrides()
    kernels = {k.name: k for k in cuconv.kernels()}
    passed = {name for name, a in answers.items() if a and kernels[name].passes_over(a) is not None}
    first = next(name for name, a in answers.items() if a and name not in passed)
    assert e.kernel == first
    assert {n: r for n, r in e.declined.items() if n not in passed} == {
        name: a.reason for name, a in answers.items() if not a}
    assert all("passes it over" in e.declined[n] for n in passed)
    assert set(e.skipped) == {name for name, a in answers.items() if a and name != first and name not in passed}
    text = str(e)
    assert f"runs: {e.kernel} [{e.detail}]" in text and all(f"declined {n}: " in text for n in e.declined)


def test_forced_and_strategy():
    p = PROBLEMS["conv2d_bf16"]
    plan, e = dispatch.select(p, H100, forced="sm80_igemm")
    assert plan.kernel.name == "sm80_igemm" and e.forced and "(forced)" in str(e) and not e.declined
    with pytest.raises(ValueError, match="kernel: expected one of") as err:
        dispatch.select(p, H100, forced="no_such_kernel")
    assert "'no_such_kernel'" in str(err.value)
    with pytest.raises(KernelDeclined, match="'sm90_tma' declines this problem: dtype float32"):
        dispatch.select(PROBLEMS["conv2d_fp32"], H100, forced="sm90_tma")
    assert issubclass(KernelDeclined, ValueError) and cuconv.KernelDeclined is KernelDeclined
    p3 = PROBLEMS["conv3d_temporal_pad"]
    plan, e = dispatch.select(p3, H100, strategy="generic")
    assert plan.kernel.name == "generic_gpu" and "'generic' was asked for" in e.declined["conv3d_native"]
    with pytest.raises(KernelDeclined, match="strategy: no 'qslice' kernel"):
        dispatch.select(p3, H100, strategy="qslice")  # temporal padding: the Q-slice strategy declines


def test_cpu_runs_through_its_plan():
    """The CPU kernel's plan computes the conv (the same plan object explain shows)."""
    import numpy as np

    from conftest import assert_close, random_array
    rng = np.random.default_rng(0)
    x = random_array(rng, (2, 7, 8, 6), "float32")
    w = random_array(rng, (5, 3, 3, 6), "float32")
    e = cuconv.explain(x, w, padding=1)
    assert e.kernel == "cpu" and e.plan.kernel.name == "cpu"
    out = np.full((2, 7, 8, 5), np.nan, np.float32)
    e.plan.run(x, w, None, None, out)
    assert_close(out, cuconv.reference.conv2d(x, w, padding=1), "float32")


# ----------------------------------------------------------------------------------------- the memo of plans
def test_plan_memo_is_keyed_on_overrides():
    """explain inside ``cuconv.overrides(block_n=...)`` names the forced tile; outside, the automatic one;
    the same key gives the same plan object (one memo of plans)."""
    p = problem2d(N=2, H=20, W=40, C=64, K=64, R=1, S=1, padding=0)
    auto_plan, auto = dispatch.select(p, H100)
    assert "x64x64_" in auto.detail and auto.overrides == current_overrides()
    with cuconv.overrides(block_n=192) as o:
        forced_plan, forced = dispatch.select(p, H100)
        assert forced.overrides == o and "x192x64_" in forced.detail and "overrides: block_n=192" in str(forced)
        assert dispatch.select(p, H100)[0] is forced_plan
        with cuconv.overrides(block_n=None):
            assert dispatch.select(p, H100)[0] is auto_plan
    again_plan, again = dispatch.select(p, H100)
    assert again_plan is auto_plan and "x64x64_" in again.detail and "overrides:" not in str(again)
    assert forced_plan is not auto_plan and forced_plan.cfg.block_n == 192 and auto_plan.cfg.block_n == 64
    # an explicit overrides value is the same key as the same value in force
    assert dispatch.select(p, H100, overrides=Overrides(block_n=192))[0] is forced_plan


def test_explain_copies_are_the_callers():
    import numpy as np
    x, w = np.ones((1, 4, 4, 2), np.float32), np.ones((3, 1, 1, 2), np.float32)
    e = cuconv.explain(x, w)
    e.declined["cpu"] = "changed"
    assert cuconv.explain(x, w).declined.get("cpu") != "changed"


# ----------------------------------------------------------------------------------------- overrides
@pytest.mark.parametrize("field,value", [
    ("block_n", 100), ("block_n", True), ("block_n", "128"), ("block_m", 96), ("block_m", 512), ("cluster", 3),
    ("cluster", 0), ("split", "yes"), ("split", 1), ("halo", 0), ("halo", "auto-ish"), ("pingpong", "no"),
    ("sm80_subpath", "fastest"), ("sm80_subpath", 1),
])
def test_overrides_refuse_bad_values_naming_the_field(field, value):
    outside = current_overrides()
    with pytest.raises(ValueError, match=f"^{field}: expected") as err:
        with cuconv.overrides(**{field: value}):
            pass
    assert repr(value) in str(err.value)
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        Overrides(**{field: value})
    assert current_overrides() == outside


def test_overrides_blocks_nest_and_are_context_local():
    with pytest.raises(TypeError):
        with cuconv.overrides(bn=128):
            pass
    base = current_overrides()
    with cuconv.overrides(block_n=128, halo=False) as outer:
        assert outer == Overrides(block_n=128, halo=False) and outer.describe() == "block_n=128, halo=False"
        with cuconv.overrides(halo="auto", split=True) as inner:  # "auto" is None: automatic again
            assert inner == Overrides(block_n=128, split=True)
        assert current_overrides() == outer
        seen = []
        t = threading.Thread(target=lambda: seen.append(current_overrides()))
        t.start()
        t.join()
        assert seen == [base], "a new thread starts from the environment's overrides"
    assert current_overrides() == base and Overrides().describe() == ""
    with pytest.raises(ValueError):
        with cuconv.overrides(block_n=64):
            raise ValueError("inside")
    assert current_overrides() == base, "an exception leaves the block"


# ----------------------------------------------------------------------------------------- registry and imports
def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_registry_refuses_a_second_kernel_of_the_same_name():
    """In a fresh interpreter (the test's kernels stay out of this one's registry)."""
    code = """
import json
from cuconv import dispatch
from cuconv.device import CPU
from cuconv.plan import Declined, Kernel
from cuconv.problem import ConvProblem
from cuconv.registry import register, registered
out = {}
class Impostor(Kernel):
    name = "cpu"
try:
    register(Impostor())
except ValueError as e:
    out["duplicate"] = str(e)
cpu = next(k for k in registered() if k.name == "cpu")
out["same_instance"] = register(cpu) is cpu
try:
    register(object())
except TypeError as e:
    out["type"] = str(e)
p = ConvProblem.create(nd=2, batch=1, in_spatial=(4, 4), channels=2, out_channels=2, filter_spatial=(1, 1),
                       stride=1, dilation=1, padding=0, groups=1, dtype="bfloat16", layout="NHWC")
first = dispatch.select(p, CPU)[1]
class Extra(Kernel):
    name = "extra_test_kernel"
    priority = 1000
    def make_plan(self, problem, device, overrides):
        return Declined("declines everything")
register(Extra())
second = dispatch.select(p, CPU)[1]
out["memo_dropped"] = "extra_test_kernel" not in first.declined and second.declined.get("extra_test_kernel")
print(json.dumps(out))
"""
    res = _run(code)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert "kernel: a kernel named 'cpu' is already registered" in out["duplicate"]
    assert out["same_instance"] is True and "Kernel instance" in out["type"]
    assert out["memo_dropped"] == "declines everything", "registering a kernel drops the memo of plans"


def _modules():
    """{dotted name: path} of every module of the cuconv package."""
    out = {}
    for f in sorted((ROOT / "cuconv").rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path, modules: dict, module_level_only: bool) -> set:
    """The cuconv modules ``name`` imports (module level, or also inside functions)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    nodes = tree.body if module_level_only else ast.walk(tree)
    found = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            found |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - n.level + 1] + ([n.module] if n.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in n.names}
    return {m for m in found if m in modules and m != name}


def _cycle(graph: dict):
    """One import circle of ``graph`` as a list of modules, or None."""
    state, stack = {}, []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == "open":
                return stack[stack.index(v):] + [v]
            if v not in state:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


@pytest.mark.parametrize("module_level_only", [True, False], ids=["module_level", "with_function_imports"])
def test_no_import_circle(module_level_only):
    modules = _modules()
    graph = {m: _imports(m, p, modules, module_level_only) for m, p in modules.items()}
    assert graph["cuconv.dispatch"] >= {"cuconv.backends", "cuconv.registry"}, "the walk misses imports"
    assert "cuconv.dispatch" not in set().union(*(graph[m] for m in modules if m.startswith("cuconv.backends")))
    circle = _cycle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_every_module_imports_first_in_a_fresh_interpreter():
    """Importing any module of cuconv first works (a circle shows as a partially initialised module),
    and importing the whole package pulls in no CuPy."""
    names = [m for m in _modules() if not m.endswith("__main__")]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(names, pool.map(lambda m: _run(f"import {m}"), names)))
    failed = {m: r.stderr.strip().splitlines()[-1:] for m, r in results.items() if r.returncode}
    assert not failed, failed
    res = _run("import sys, cuconv, cuconv.backends, cuconv.dispatch; print('cupy' in sys.modules)")
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr
