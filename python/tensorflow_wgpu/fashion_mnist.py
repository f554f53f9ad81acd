"""Fashion-MNIST from its IDX files (Debian package `dataset-fashion-mnist`). Nothing is
downloaded: `keras.datasets` would fetch from the internet."""
import gzip
import os
import struct

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


class MissingDataset(FileNotFoundError):
    pass


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError(f"{path}: not an IDX file")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {arr.size} values for shape {dims}")
    return arr.reshape(dims)


def _find(directory, stem):
    for name in (f"{stem}.gz", stem):
        p = os.path.join(directory, name)
        if os.path.exists(p):
            return p
    raise MissingDataset(
        f"Fashion-MNIST file {stem}(.gz) not found in {directory}. On Debian: "
        "sudo apt-get install dataset-fashion-mnist (or pass --data-dir)"
    )


def load(directory=DEFAULT_DIR):
    """(x_train, y_train), (x_test, y_test): uint8 images [n, 28, 28] and uint8 labels."""
    train_x = _read_idx(_find(directory, "train-images-idx3-ubyte"))
    train_y = _read_idx(_find(directory, "train-labels-idx1-ubyte"))
    test_x = _read_idx(_find(directory, "t10k-images-idx3-ubyte"))
    test_y = _read_idx(_find(directory, "t10k-labels-idx1-ubyte"))
    return (train_x, train_y), (test_x, test_y)
