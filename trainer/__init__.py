"""The reference TorchRec trainer (installed as `airflow_ett.trainer`). Never imports Airflow.

It runs by itself (`python -m airflow_ett.trainer`) and under torchrun, reporting every
phase through `airflow_ett.emit`.
"""

from __future__ import annotations


class TorchRecMissingError(ImportError):
    """torchrec is installed separately (with --no-deps); say how, in one line."""


def require_torchrec() -> None:
    """Import torchrec or fail with the one line that fixes it.

    torchrec declares the CUDA build of fbgemm-gpu as a dependency; pip would install it
    over fbgemm-gpu-cpu and break the CPU build, so our setup installs torchrec with
    --no-deps and we cannot let pip pull it in implicitly.
    """
    try:
        import torchrec  # noqa: F401
    except ImportError as exc:
        raise TorchRecMissingError(
            "torchrec is not installed: run `pip install --no-deps torchrec==1.8.0` "
            f"(after `pip install -c constraints.txt -e .`); import failed with: {exc}"
        ) from exc
