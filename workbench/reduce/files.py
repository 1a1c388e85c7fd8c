"""Running the written pair as the README does, and writing arrays."""

from __future__ import annotations

import io
import zipfile

import numpy as np

from .common import _CASTS, ReduceError


def run_ort(model, inputs: dict[str, np.ndarray], provider: str = "CPUExecutionProvider"
            ) -> dict[str, np.ndarray]:
    """Run ``model`` (a path, bytes, or a ModelProto whose weights may be left mapped) as the README snippet
    does: a fresh ONNX Runtime session with default options, every input cast to the type the model declares."""
    import onnxruntime as ort

    providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    options = None
    if hasattr(model, "SerializeToString"):
        from ..model.mapped import ort_options, session_source

        model, folder = session_source(model)
        options = ort_options(ort.SessionOptions(), folder)
    session = ort.InferenceSession(model, options, providers=providers)
    with np.errstate(over="ignore", invalid="ignore"):
        feed = {i.name: np.asarray(inputs[i.name]).astype(_CASTS.get(i.type, inputs[i.name].dtype))
                for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feed)))


def _ort_or_fail(what: str, model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        return run_ort(model, inputs)
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors share no base class worth naming
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ReduceError(f"{what} does not run on ONNX Runtime CPU: {first}",
                          "pick another node with --node, or report the failure itself") from e


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed .npz of ``arrays`` (any names, never pickled), as bytes."""
    from numpy.lib import format as npy_format

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                npy_format.write_array(fh, np.asarray(value), allow_pickle=False)
    return buf.getvalue()


def _agrees(metrics: dict) -> bool:
    """Float round-off: reference.onnx on ORT CPU against the reference engine's values."""
    sqnr = metrics.get("sqnr_db")
    return not (metrics.get("nonfinite_mismatch") or 0) and (sqnr is None or sqnr > 60)


