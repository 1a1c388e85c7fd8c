"""Recognise files that are not ONNX models, to say what they are instead of a parser error."""

from __future__ import annotations

_SIGNATURES = [
    (b"version https://git-lfs", "a Git LFS pointer, not the model itself", "run `git lfs pull` to fetch the model"),
    (b"PK\x03\x04", "a zip archive (a PyTorch .pt/.pth checkpoint or a zipped folder)",
     "export a PyTorch model to ONNX first (torch.onnx.export) or pass the torch.nn.Module with example "
     "inputs; unzip an archive first"),
    (b"\x89HDF", "an HDF5 file (a Keras model?)", "convert it to ONNX first (e.g. tf2onnx)"),
    (b"\x93NUMPY", "a NumPy .npy array", "pass the .onnx model; arrays go to --inputs"),
    (b"ftrt", "a serialized TensorRT engine", "pass the ONNX model the engine was built from"),
    (b"{", "a JSON/text file", "pass the binary .onnx file"),
    (b"ir_version", "an ONNX model in text format", "convert it with onnx.parser / onnx.printer to binary"),
    (b"<", "an XML/HTML file (an OpenVINO IR .xml or a web page saved by mistake?)", "pass the .onnx file"),
]


def sniff(head: bytes) -> tuple[str, str] | None:
    """Return ``(what_it_is, what_to_do)`` for a known non-ONNX file header, else None."""
    stripped = head.lstrip()
    for magic, what, hint in _SIGNATURES:
        if head.startswith(magic) or (magic in (b"{", b"<", b"ir_version") and stripped.startswith(magic)):
            return what, hint
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return ("a Python pickle (a PyTorch .pt/.pth checkpoint?); it is never unpickled",
                "export the model to ONNX first (torch.onnx.export)")
    return None
