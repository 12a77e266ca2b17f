"""CUDA runtime on a GPU: graph replay, contexts across threads, load/unload cycles, I/O types."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import graphc
import graphc.runtime
import models

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    m = models.build("mlp", size="tiny")
    feeds = models.sample_inputs("mlp", m)
    eng = graphc.compile(m, target="cuda", shapes={k: v.shape for k, v in feeds.items()})
    path = tmp_path_factory.mktemp("cuda") / "mlp.engine"
    eng.save(path)
    ref = graphc.interpret(graphc.load_onnx(m), feeds)
    return eng, feeds, path, ref


def test_graph_replay_equals_plain_launches(mlp):
    eng, feeds, _, ref = mlp
    ctx = eng.executor.default
    a = {k: v.get() for k, v in ctx.run(feeds, use_graph=False).items()}
    b = {k: v.get() for k, v in ctx.run(feeds, use_graph=True).items()}
    c = {k: v.get() for k, v in ctx.run(feeds, use_graph=True).items()}  # replay
    for k in ref:
        np.testing.assert_array_equal(a[k], b[k])
        np.testing.assert_array_equal(b[k], c[k])
        np.testing.assert_allclose(a[k], ref[k], rtol=1e-4, atol=1e-4)


def test_inputs_from_cupy_and_dlpack(mlp):
    import cupy

    eng, feeds, _, ref = mlp
    dev = {k: cupy.asarray(v) for k, v in feeds.items()}
    out = eng.run(dev)
    assert isinstance(next(iter(out.values())), cupy.ndarray)
    for k in ref:
        np.testing.assert_allclose(out[k].get(), ref[k], rtol=1e-4, atol=1e-4)
    try:
        import torch
    except ImportError:
        return
    tin = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    out = eng.run(tin, to_numpy=True)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-4, atol=1e-4)


def test_four_threads_with_their_own_contexts(mlp):
    eng, feeds, _, ref = mlp
    rng = np.random.default_rng(0)
    inputs = [{k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()} for _ in range(4)]
    refs = [graphc.interpret(graphc.load_onnx(models.build("mlp", size="tiny")), f) for f in inputs]
    errors = []

    def work(i):
        ctx = eng.create_context()
        for _ in range(20):
            out = ctx.run(inputs[i], to_numpy=True)
            for k in refs[i]:
                if not np.allclose(out[k], refs[i][k], rtol=1e-4, atol=1e-4):
                    errors.append((i, k))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_load_unload_cycles_leave_memory_where_it_was(mlp):
    import gc
    import os
    import weakref

    import cupy

    _, feeds, path, _ = mlp
    pool = cupy.get_default_memory_pool()
    e = graphc.runtime.load(path)
    e.run(feeds)
    del e
    gc.collect()
    pool.free_all_blocks()
    used0, total0 = pool.used_bytes(), pool.total_bytes()
    free0, _ = cupy.cuda.runtime.memGetInfo()
    contexts = []
    for _ in range(1000):
        e = graphc.runtime.load(path)
        contexts.append(weakref.ref(e.executor.default))  # its arena, modules and graph go with it
        del e
    gc.collect()
    pool.free_all_blocks()
    free1, _ = cupy.cuda.runtime.memGetInfo()
    # this process's memory: every context collected, the pool back where it was
    assert not [c for c in contexts if c() is not None]
    assert (pool.used_bytes(), pool.total_bytes()) == (used0, total0)
    # device-wide free memory, only alone on the GPU: under pytest -n 8 other workers creating their
    # CUDA contexts meanwhile took 2 GB (H200, 2026-12-01); one-sided (more free is no leak)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1:
        assert free0 - free1 < 64 * 2**20, (free0, free1)
