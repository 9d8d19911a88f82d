"""Side-by-side benchmarks: prompt sets, method runners (ours and peers), reports."""
