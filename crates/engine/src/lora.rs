//! Which LoRA adapters a request runs with: the engine's global scales (one per adapter the
//! model loaded, set at start by `--lora`/`--lora-scaled` and later by the server's
//! `POST /lora-adapters`), or the request's own list, as llama-server reads them: an adapter
//! the list does not name runs at scale 0.
//!
//! A request's adapters are fixed when it is submitted, so changing the global scales never
//! changes a request already running.

use std::sync::RwLock;

use onebit_model::LoraUse;

use crate::{Engine, EngineError};

/// The global scales, by adapter id.
#[derive(Debug, Default)]
pub(crate) struct LoraScales(RwLock<Vec<f32>>);

impl LoraScales {
    pub fn new(n_adapters: usize) -> LoraScales {
        LoraScales(RwLock::new(vec![1.0; n_adapters]))
    }
}

impl Engine {
    /// The global scale of each adapter, by id.
    pub fn lora_scales(&self) -> Vec<f32> {
        self.lora.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Set the global scales: the adapters listed get their scale, every other one 0.
    pub fn set_lora_scales(&self, uses: &[LoraUse]) -> Result<(), EngineError> {
        let n = self.model().loras().len();
        self.check_lora(uses)?;
        let mut scales = vec![0.0; n];
        uses.iter().for_each(|u| scales[u.id] = u.scale);
        *self.lora.0.write().unwrap_or_else(|e| e.into_inner()) = scales;
        Ok(())
    }

    /// The adapters a request runs with: `asked` (adapters it does not name at scale 0), or
    /// the global scales without it. Adapters at scale 0 are left out and the rest sorted by
    /// id, so that equal choices are equal lists (one group in a batch, one prefix cache).
    pub fn resolve_lora(&self, asked: Option<&[LoraUse]>) -> Result<Vec<LoraUse>, EngineError> {
        let mut scales = match asked {
            None => self.lora_scales(),
            Some(uses) => {
                self.check_lora(uses)?;
                let mut s = vec![0.0; self.model().loras().len()];
                // As llama-server: a later entry for the same id wins.
                uses.iter().for_each(|u| s[u.id] = u.scale);
                s
            }
        };
        let uses = scales.drain(..).enumerate().filter(|&(_, s)| s != 0.0).map(|(id, scale)| LoraUse { id, scale });
        Ok(uses.collect())
    }

    fn check_lora(&self, uses: &[LoraUse]) -> Result<(), EngineError> {
        let n = self.model().loras().len();
        for u in uses {
            if u.id >= n {
                let loaded = if n == 0 { "none are loaded (--lora)".to_string() } else { format!("ids 0..{n}") };
                return Err(EngineError::BadRequest(format!("no LoRA adapter with id {}: {loaded}", u.id)));
            }
            if !u.scale.is_finite() {
                return Err(EngineError::BadRequest(format!("LoRA adapter {}: scale {} is not finite", u.id, u.scale)));
            }
        }
        Ok(())
    }
}
