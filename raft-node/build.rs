//! Rebuilds the node when a dashboard file changes: `include_dir!` embeds `ui/` at
//! compile time, and cargo does not otherwise know the files are inputs.

fn main() {
    println!("cargo:rerun-if-changed=ui");
}
