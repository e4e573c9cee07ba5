"""Subset forwards over an assembled cache: the scoring pass, the refresh pass and the batched
decode forward."""
