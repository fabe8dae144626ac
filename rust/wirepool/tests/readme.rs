//! The top README's Rust code is the `readme_worker` and `readme_parent` examples, printed whole:
//! this test keeps the two equal and runs the parent, which starts the worker binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The ```rust blocks of a Markdown file, in order.
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```rust") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().expect("open block")),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "a ```rust block is not closed");
    blocks
}

#[test]
fn readme_rust_code_is_the_examples_printed_whole() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let blocks = rust_blocks(&readme);
    let examples = ["readme_worker.rs", "readme_parent.rs"];
    assert_eq!(
        blocks.len(),
        examples.len(),
        "README.md should hold exactly the {} examples as ```rust blocks",
        examples.len()
    );
    for (block, name) in blocks.iter().zip(examples) {
        let path = root.join("rust/wirepool/examples").join(name);
        let code = std::fs::read_to_string(&path).expect("example source");
        assert!(
            *block == code,
            "README.md's block for {name} differs from {}: copy the file into the README",
            path.display()
        );
    }
}

#[test]
fn rust_blocks_are_extracted_whole_and_in_order() {
    let md = "text\n```rust\nfn a() {}\n\n```\n```python\nx\n```\n```rust\nfn b() {}\n```\n";
    assert_eq!(rust_blocks(md), ["fn a() {}\n\n", "fn b() {}\n"]);
}

#[tokio::test(flavor = "current_thread")]
async fn readme_parent_runs_the_readme_worker() {
    // Cargo builds the examples next to the test binaries' directory (target/<profile>/examples).
    let exe = std::env::current_exe().expect("test binary path");
    let examples = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>")
        .join("examples");
    let parent = examples.join("readme_parent");
    assert!(
        parent.exists() && examples.join("readme_worker").exists(),
        "{} missing: run through `cargo test`, which builds examples",
        parent.display()
    );
    let mut command = tokio::process::Command::new(&parent);
    command.kill_on_drop(true); // the workers die with it (PR_SET_PDEATHSIG)
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("readme_parent finished within 120 s")
        .expect("readme_parent ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "readme_parent failed: {}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout, "add: 5\ndecls: last row 99999 decl_99999 theorem\n",
        "readme_parent's output"
    );
}
