//! The yew components: they render a [`Page`] and dispatch [`PageAction`]s; every number
//! comes from `page.rs`/`state.rs` (napkin-core's predictor) or from the training worker.

mod charts;
mod controls;
mod exercise;
mod files;
mod format;
mod run;
mod summary;
mod teach;

use std::rc::Rc;

use wasm_bindgen::prelude::*;
use yew::prelude::*;

use crate::page::{Page, PageAction, reduce_page};

/// The page state inside yew's reducer hook.
#[derive(Debug, Clone, PartialEq, Default)]
struct Store(Page);

impl Reducible for Store {
    type Action = PageAction;

    fn reduce(self: Rc<Self>, action: PageAction) -> Rc<Self> {
        Rc::new(Store(reduce_page(&self.0, action)))
    }
}

#[function_component(App)]
fn app() -> Html {
    let store = use_reducer_eq(Store::default);
    let dispatch = {
        let store = store.clone();
        Callback::from(move |a: PageAction| store.dispatch(a))
    };
    let page = &store.0;
    let view = page.sandbox.view();
    html! {
        <main>
            <header>
                <h1>{ "napkin" }</h1>
                <p class="tagline">
                    { "Toggle each memory trick, read the napkin-math prediction, and measure a real training step in this tab." }
                </p>
            </header>
            <div class="layout">
                <controls::Controls state={page.sandbox.clone()} error={page.control_error.clone()} dispatch={dispatch.clone()} />
                <div class="results">
                    <summary::Summary state={page.sandbox.clone()} view={Rc::new(view.clone())} />
                    <charts::LayerChart view={Rc::new(view.clone())} run={page.run.report.clone().map(Rc::new)} />
                    <charts::TimelineChart view={Rc::new(view)} />
                    <run::TrainPanel state={page.sandbox.clone()} backend={page.backend} run={Rc::new(page.run.clone())} dispatch={dispatch.clone()} />
                    <teach::TeachPanel lesson={page.lesson.clone()} run={Rc::new(page.real.clone())} dispatch={dispatch.clone()} />
                    <files::Files imported={page.imported.clone().map(Rc::new)} imported_run={page.imported_run.clone().map(Rc::new)} error={page.import_error.clone()} dispatch={dispatch.clone()} />
                    <exercise::ExercisePanel mode={page.exercise.clone().map(Rc::new)} dispatch={dispatch} />
                </div>
            </div>
        </main>
    }
}

/// Renders the app into `<div id="app">` (called by `main.js` after the module loads).
#[wasm_bindgen]
pub fn start() {
    crate::worker::install_panic_hook();
    let Some(root) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.get_element_by_id("app"))
    else {
        return;
    };
    yew::Renderer::<App>::with_root(root).render();
}
