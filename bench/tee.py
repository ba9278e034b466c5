"""Output of a benchmark, printed and kept for bench/results/."""


class Tee:
    """Print to the terminal and keep a copy for bench/results/."""

    def __init__(self, stream) -> None:
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()
