"""Token layout and positions: where each page and the question sit, re-rotation of cached keys,
the prompt head and the page labels computed once and reused."""
