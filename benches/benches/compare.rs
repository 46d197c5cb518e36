//! The side-by-side comparisons (`webhook_guard_benches::main`): every comparison,
//! or those whose names contain one of the arguments after `--`.

fn main() {
    webhook_guard_benches::main();
}
