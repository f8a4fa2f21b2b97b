//! Benchmarks for the serve area: see BENCHMARKS.md for what each figure means and
//! how to reproduce it (`cargo bench --bench serve`).

fn main() {}
