//! Benchmarks for the executor area: see BENCHMARKS.md for what each figure means and
//! how to reproduce it (`cargo bench --bench executor`).

fn main() {}
