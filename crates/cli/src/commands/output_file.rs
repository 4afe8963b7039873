//! Writing a new file without ever harming the one already at its path: the commands that make
//! models (`quantize`, `convert`) write a temporary file beside the destination and rename it
//! into place only once it is complete. A failed or interrupted run leaves the destination as it
//! was (an older model there is not deleted, and no partial file can be mistaken for a model).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Run `write` on a temporary path in `dest`'s folder, then rename the result to `dest`; on
/// failure the temporary file is removed and `dest` is untouched.
pub fn write_atomically<T>(dest: &Path, write: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let tmp = temporary_beside(dest);
    let result = write(&tmp).and_then(|v| {
        std::fs::rename(&tmp, dest).with_context(|| format!("moving {} to {}", tmp.display(), dest.display()))?;
        Ok(v)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `DIR/.NAME.partial-PID` for `DIR/NAME`.
fn temporary_beside(dest: &Path) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_partial_one() {
        let dir = std::env::temp_dir().join(format!("onebit-output-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("model.gguf");
        std::fs::write(&dest, b"old").unwrap();
        let failed: Result<()> = write_atomically(&dest, |tmp| {
            std::fs::write(tmp, b"half")?;
            anyhow::bail!("disk full")
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "the partial file is gone");
        write_atomically(&dest, |tmp| Ok(std::fs::write(tmp, b"new")?)).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
