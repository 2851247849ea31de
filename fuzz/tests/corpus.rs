//! Every fuzz target in the test suite: each committed corpus input (the minimal set that
//! keeps libFuzzer's coverage, from `scripts/fuzz.sh`) and each regression input (a crash
//! the fuzzer once found, kept by name in `fuzz/regressions/<target>/`) goes through its
//! target.

use std::path::Path;

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, target) in meridian_fuzz::TARGETS {
        let dir = root.join(name);
        let inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(inputs.len() >= 5, "{name}: a corpus of {} inputs is too thin", inputs.len());
        let regressions = root.join("../regressions").join(name);
        let regressions = std::fs::read_dir(&regressions).into_iter().flatten().map(|e| e.unwrap().path());
        for path in inputs.into_iter().chain(regressions) {
            let data = std::fs::read(&path).unwrap();
            if let Err(e) = std::panic::catch_unwind(|| target(&data)) {
                panic!("{name} fails on {}: {e:?}", path.display());
            }
        }
    }
}
