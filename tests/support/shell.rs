//! The shell the proxy container's entrypoints run under in tests.

use std::path::Path;
use std::process::Command;

/// `/bin/sh` (dash on Debian), or, when `BALANCER_TEST_BUSYBOX` names a busybox binary (by its
/// full path), its ash with busybox's own tools, as in Alpine's nginx image; and what to put first
/// on the PATH for it.
pub fn shell(scratch: &Path) -> (Command, String) {
    match std::env::var("BALANCER_TEST_BUSYBOX") {
        Ok(busybox) if !busybox.is_empty() => {
            let bin = scratch.join("busybox-bin");
            std::fs::create_dir_all(&bin).expect("a directory for busybox's tools");
            for tool in ["cat", "cp", "mv", "rm", "grep", "sed", "sort", "head", "sleep", "kill"] {
                std::os::unix::fs::symlink(&busybox, bin.join(tool)).expect("a busybox tool");
            }
            let mut command = Command::new(&busybox);
            command.arg("ash");
            (command, format!("{}:", bin.display()))
        }
        _ => (Command::new("/bin/sh"), String::new()),
    }
}
