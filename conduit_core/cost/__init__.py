"""FLOPs: what an answer is predicted to cost and what it is charged."""
