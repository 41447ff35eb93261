//! Links the image at its load address with `link.ld`.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rerun-if-changed=src/boot.S");
    println!("cargo:rerun-if-changed=../asm/el2_macros.S");
}
