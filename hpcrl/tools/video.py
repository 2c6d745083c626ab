"""Write RGB frames as an MP4 (imageio with imageio-ffmpeg) or a GIF (pillow): the ``video``
extra, ``pip install 'hpcrl[video]'``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

SUFFIXES = (".mp4", ".gif")
#: A GIF is written at the end, so its frames are held in memory (34 KB each for Atari once
#: palettised): 20,000 is about 11 minutes of Atari play at 15 frames/s, 0.7 GB.
GIF_MAX_FRAMES = 20_000


class VideoError(RuntimeError):
    """One line: the file cannot be written (unknown suffix, a missing extra)."""


def _missing(what: str, module: str) -> VideoError:
    return VideoError(f"writing {what} needs {module}: pip install 'hpcrl[video]'")


def check_video_path(path: str | Path) -> Path:
    """The path, if its suffix is one we write and the libraries for it are installed."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise VideoError(f"{path}: a video must end in {' or '.join(SUFFIXES)}")
    try:
        if path.suffix.lower() == ".gif":
            import PIL.Image  # noqa: F401
        else:
            import imageio.v2  # noqa: F401
            import imageio_ffmpeg  # noqa: F401
    except ImportError:
        raise _missing(path.suffix[1:].upper(), "pillow" if path.suffix.lower() == ".gif"
                       else "imageio and imageio-ffmpeg") from None
    return path


class VideoWriter:
    """Frames appended one by one: an MP4 is encoded as they come (an Atari episode of 27,000
    agent steps would be 2.7 GB of frames in memory); a GIF is written at ``close``, at most
    ``GIF_MAX_FRAMES`` frames."""

    def __init__(self, path: str | Path, fps: float):
        self.path, self.fps, self.frames = check_video_path(path), fps, 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._gif: list | None = None
        self._mp4 = None
        if self.path.suffix.lower() == ".gif":
            self._gif = []
        else:
            import imageio.v2 as imageio

            # yuv420p (what players expect) needs even sizes: 210x160 Atari, 400x600 CartPole
            self._mp4 = imageio.get_writer(self.path, fps=fps, codec="libx264",
                                           macro_block_size=2, ffmpeg_log_level="error",
                                           pixelformat="yuv420p")

    def append(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame, np.uint8)
        if self._gif is not None:
            from PIL import Image

            if len(self._gif) >= GIF_MAX_FRAMES:
                raise VideoError(f"{self.path}: more than {GIF_MAX_FRAMES:,} frames held for a "
                                 "GIF; write an .mp4, or play fewer episodes")
            self._gif.append(Image.fromarray(frame).quantize(256))   # 1 byte per pixel
        else:
            self._mp4.append_data(frame)
        self.frames += 1

    def close(self) -> Path:
        if self._gif is not None:
            if not self._gif:
                raise VideoError(f"{self.path}: no frames to write")
            # GIF delays are in 1/100 s: 15 fps (Atari at frame skip 4) becomes 70 ms
            self._gif[0].save(self.path, save_all=True, append_images=self._gif[1:], loop=0,
                              duration=max(20, round(1000 / self.fps / 10) * 10))
        else:
            self._mp4.close()
        return self.path


def write_video(path: str | Path, frames: Sequence[np.ndarray], fps: float) -> Path:
    """Write ``frames`` ([H, W, 3] uint8 each) to ``path`` at ``fps`` frames per second."""
    writer = VideoWriter(path, fps)
    for frame in frames:
        writer.append(frame)
    return writer.close()
