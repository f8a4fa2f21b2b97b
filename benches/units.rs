//! Benchmarks for the units area: see BENCHMARKS.md for what each figure means and
//! how to reproduce it (`cargo bench --bench units`).

fn main() {}
