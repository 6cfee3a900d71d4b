//! Compiles `im/v1/im.proto` with protox (pure Rust) and generates prost types.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=im/v1/im.proto");
    let fds = protox::compile(["im/v1/im.proto"], ["."])?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    Ok(())
}
