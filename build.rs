//! The static binary's code layout (packaging/README.md, "The static binary"): a static
//! x86_64 glibc build of the `herald` binary is linked with the functions of
//! `packaging/symbol-order.txt` first, together, so that a role maps little of its code. Only
//! there: lld, Rust's linker on x86_64 Linux (glibc) since 1.90, takes the list; GNU ld and
//! gold, the linkers elsewhere, refuse it, and a build that swaps in another linker for that
//! target is not supported. Said here rather than in `cargo static`'s flags so that a new list
//! rebuilds the static binary and the path does not depend on where cargo runs the linker.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let static_build = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if !static_build
        || var("CARGO_CFG_TARGET_ARCH") != "x86_64"
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
    {
        return;
    }
    // (Only here: a new list rebuilds the static build alone, not every other profile.)
    println!("cargo:rerun-if-changed=packaging/symbol-order.txt");
    let list = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("packaging/symbol-order.txt");
    if list.is_file() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        // A name the list has and the binary does not (renamed by a dependency or toolchain
        // update) is passed over without a line per name.
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}
