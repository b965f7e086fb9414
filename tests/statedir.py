"""What the Python checks look at of a server's --state-dir: its images, as
files, and a byte of one changed."""
import os
import time


def images(d):
    """The image files in state directory |d|, by name."""
    return sorted(f for f in os.listdir(os.path.join(d, "images")) if f.endswith(".img"))


def image_path(d, name):
    return os.path.join(d, "images", name)


def flip(path, at=None):
    """Changes one byte of |path| (the middle one unless |at|)."""
    with open(path, "r+b") as f:
        size = f.seek(0, 2)
        at = size // 2 if at is None else at
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x20]))


def wait_for(pred, seconds=60):
    """Polls |pred| (bounded) until it holds; whether it did."""
    end = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True
