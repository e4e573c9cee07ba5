"""Tests of the storage layer (real Redis servers, real files)."""
