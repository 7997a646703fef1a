"""vramplan from Python: GPU memory of PyTorch training steps, before you
run them.

The functions call libvramplan.so through ctypes (standard library only, no
build step) and return plain dicts with exact integer byte counts:

    >>> import vramplan
    >>> e = vramplan.estimate("gpt2-small", batch=8, seq=1024,
    ...                       precision="amp-bf16")
    >>> e["peak_alloc"], e["by_category"]["activations"]
    >>> vramplan.maxbatch("llama-1b", gpu="rtx4090", budget=0.9,
    ...                   precision="bf16")["max_batch"]
    >>> vramplan.plan("llama-1b", gpu="rtx4090", global_batch=64)

MODEL is a name (models/NAME.yaml in vramplan's search path) or a file.
Keyword arguments are the setup of `vramplan estimate` with underscores:
batch, seq, precision, optimizer, checkpoint, selective, accum, steps,
attention, keep_grads, inference, expandable_segments, offload_optimizer,
offload_activations, compress_activations, int8_weights, context,
cublas_workspace, budget (bytes, "24GiB", or a fraction with gpu), gpu,
gpu_dir, the fine-tuning setup (lora="r=16,alpha=32,targets=all-linear",
freeze, quant, double_quant, load, base_dtype), and global_batch for plan;
estimate also takes a data-parallel run simulated rank by rank
(docs/DISTRIBUTED.md): strategy, world, shard, param_dtype, reduce_dtype,
reshard_after_forward, bucket_cap, rebuild_freed, cpu_offload, and for
DeepSpeed's strategies ds_config, a dict of its zero_optimization knobs by
their config names (the result's "dist" lists the rank roles; the rest is
the most loaded rank's). An unknown argument raises TypeError.

Errors raise vramplan.Error, whose str() is "file:line:col: message" for
an error in a model or profile file; .code, .path, .line and .column carry
the parts.

The library is found, in order: $VRAMPLAN_LIB; libvramplan.so.0 in the lib
directory of the prefix this package is installed under
(PREFIX/lib/vramplan/python/vramplan -> PREFIX/lib); build/ of the source
tree this package sits in; the dynamic linker's search path.
"""

import ctypes
import json
import os

__all__ = ["Error", "estimate", "maxbatch", "plan", "call", "library_path"]

_SONAME = "libvramplan.so.0"


class _VpError(ctypes.Structure):
    # include/vramplan/error.h: vp_error
    _fields_ = [
        ("code", ctypes.c_int),
        ("path", ctypes.c_char * 256),
        ("line", ctypes.c_uint32),
        ("col", ctypes.c_uint32),
        ("width", ctypes.c_uint32),
        ("msg", ctypes.c_char * 512),
    ]


class Error(Exception):
    """An error of the vramplan library."""

    def __init__(self, code, name, message, path="", line=0, column=0):
        self.code = code
        self.name = name
        self.message = message
        self.path = path
        self.line = line
        self.column = column
        if path and line:
            text = "%s:%d:%d: %s" % (path, line, column, message)
        elif path:
            text = "%s: %s" % (path, message)
        else:
            text = message
        super().__init__(text)


def _candidates():
    env = os.environ.get("VRAMPLAN_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    # installed: PREFIX/lib/vramplan/python/vramplan
    yield os.path.normpath(os.path.join(here, "..", "..", "..", _SONAME))
    # the source tree: python/vramplan next to build/
    yield os.path.normpath(os.path.join(here, "..", "..", "build", _SONAME))
    yield _SONAME


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        lib.vp_api_call.argtypes = [ctypes.c_char_p,
                                    ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.POINTER(_VpError)]
        lib.vp_api_call.restype = ctypes.c_int
        lib.vp_api_free.argtypes = [ctypes.c_void_p]
        lib.vp_api_free.restype = None
        lib.vp_err_name.argtypes = [ctypes.c_int]
        lib.vp_err_name.restype = ctypes.c_char_p
        return lib, path
    raise ImportError("vramplan: cannot load the library; tried: " +
                      "; ".join(tried) + " (set VRAMPLAN_LIB)")


_lib, _path = _load()


def library_path():
    """The file of the libvramplan loaded."""
    return _path


def call(request):
    """Run one request of the JSON API (include/vramplan/api.h): a dict
    with a "command" and the setup. Returns the response as a dict."""
    raw = json.dumps(request).encode("utf-8")
    out = ctypes.c_void_p()
    err = _VpError()
    st = _lib.vp_api_call(raw, ctypes.byref(out), ctypes.byref(err))
    try:
        text = ctypes.string_at(out.value).decode("utf-8") \
            if out.value else None
    finally:
        if out.value:
            _lib.vp_api_free(out)
    if text is not None:
        return json.loads(text)  # VP_OK, or an estimate that does not fit
    name = _lib.vp_err_name(st).decode()
    raise Error(st, name, err.msg.decode("utf-8", "replace"),
                err.path.decode("utf-8", "replace"), err.line, err.col)


_SETUP = {"batch", "seq", "target", "precision", "optimizer", "checkpoint",
          "selective", "accum", "steps", "attention", "keep_grads",
          "inference", "expandable_segments", "offload_optimizer",
          "offload_activations", "compress_activations", "int8_weights",
          "context", "cublas_workspace", "budget", "gpu", "gpu_dir",
          "lora", "freeze", "quant", "double_quant", "load", "base_dtype",
          "generate", "cache"}


def _request(command, model, kwargs, extra=()):
    unknown = sorted(set(kwargs) - _SETUP - set(extra))
    if unknown:
        raise TypeError("%s() got an unexpected keyword argument %r"
                        % (command, unknown[0]))
    req = {"command": command, "model": os.fspath(model)}
    req.update(kwargs)
    return call(req)


_DIST = ("strategy", "world", "shard", "param_dtype", "reduce_dtype",
         "reshard_after_forward", "bucket_cap", "rebuild_freed", "cpu_offload",
         "ds_config")


def estimate(model, **setup):
    """Simulate training steps of MODEL (or, with generate="prompt=N,new=N",
    model.generate() calls, and cache="dynamic"|"static"). Returns
    peak_alloc, peak_reserved, device_used, by_category, top_layers, steps
    (generate: one per call, and "generate" with the KV cache bytes), and
    fits (False when the steps do not fit in budget; error says where the
    run stopped). With strategy (and world), every rank role of the
    data-parallel run is simulated: "dist" lists them, the rest is the most
    loaded rank's."""
    return _request("estimate", model, setup, extra=_DIST)


def maxbatch(model, **setup):
    """The largest micro-batch that fits in budget (or gpu): max_batch,
    trials, and at_max, the estimate at that batch."""
    return _request("maxbatch", model, setup)


def plan(model, **setup):
    """The fastest setup on one GPU (gpu is required) for global_batch
    samples per step: candidates, fitting first and fastest first."""
    return _request("plan", model, setup, extra=("global_batch",))
