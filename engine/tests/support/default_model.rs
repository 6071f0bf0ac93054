//! The real default model, fetched on first use and loaded once per test binary.

use std::sync::{Arc, OnceLock};

use tpslab_engine::model::LoadedModel;

pub fn model() -> Arc<LoadedModel> {
    static M: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    M.get_or_init(|| {
        let p =
            tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("model");
        Arc::new(LoadedModel::load(&p).expect("load"))
    })
    .clone()
}
