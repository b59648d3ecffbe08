//! The notebooks in `notebooks/` run: their code cells, extracted by `build.rs`, are compiled
//! against napkin-core and executed in order. Each notebook asserts that its worked answers
//! pass the exercise checker (and that a named mistake does not).

include!(concat!(env!("OUT_DIR"), "/notebooks.rs"));

#[test]
fn every_notebook_runs_and_its_answers_check() {
    assert!(NOTEBOOKS.len() >= 4, "{} notebooks", NOTEBOOKS.len());
    for (name, run) in NOTEBOOKS {
        eprintln!("notebook {name}");
        run();
    }
}
