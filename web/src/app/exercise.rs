//! The exercise mode: pick an exercise (seeded, so learners get different numbers), answer
//! with units, get the checker's verdict and the hint; a correct answer sets the sandbox to
//! the exercise's scenario so the prediction (and, for tiny models, a measurement) is one
//! click away.

use std::rc::Rc;

use napkin_core::exercises::catalog;
use web_sys::{HtmlInputElement, HtmlSelectElement};
use yew::prelude::*;

use crate::page::{ExerciseMode, PageAction, first_exercise};

#[derive(Properties, PartialEq)]
pub struct ExerciseProps {
    pub mode: Option<Rc<ExerciseMode>>,
    pub dispatch: Callback<PageAction>,
}

#[function_component(ExercisePanel)]
pub fn exercise_panel(props: &ExerciseProps) -> Html {
    let d = props.dispatch.clone();
    let Some(mode) = &props.mode else {
        let open =
            Callback::from(move |_| d.emit(PageAction::OpenExercise(first_exercise().into(), 1)));
        return html! {
            <section class="panel" id="exercises">
                <h2>{ "Exercises" }</h2>
                <button id="open-exercises" onclick={open}>{ "Open the exercises" }</button>
            </section>
        };
    };
    let x = &mode.instance;
    let seed = x.seed;
    let on_pick = {
        let d = d.clone();
        Callback::from(move |e: Event| {
            let select: HtmlSelectElement = e.target_unchecked_into();
            d.emit(PageAction::OpenExercise(select.value(), seed));
        })
    };
    let id = x.id.to_string();
    let on_seed = {
        let d = d.clone();
        let id = id.clone();
        Callback::from(move |e: Event| {
            let input: HtmlInputElement = e.target_unchecked_into();
            if let Ok(seed) = input.value().trim().parse::<u64>() {
                d.emit(PageAction::OpenExercise(id.clone(), seed));
            }
        })
    };
    let on_answer = {
        let d = d.clone();
        Callback::from(move |e: InputEvent| {
            let input: HtmlInputElement = e.target_unchecked_into();
            d.emit(PageAction::SetAnswer(input.value()));
        })
    };
    let on_submit = {
        let d = d.clone();
        Callback::from(move |e: SubmitEvent| {
            e.prevent_default();
            d.emit(PageAction::CheckAnswer);
        })
    };
    let on_hint = {
        let d = d.clone();
        Callback::from(move |_| d.emit(PageAction::ShowHint))
    };
    let on_close = Callback::from(move |_| d.emit(PageAction::CloseExercise));
    html! {
        <section class="panel" id="exercises">
            <h2>{ "Exercises" }</h2>
            <label for="exercise-pick">{ "Exercise " }
                <select id="exercise-pick" onchange={on_pick}>
                    { for catalog().iter().map(|e| html! { <option value={e.id} selected={e.id == x.id}>{ e.title }</option> }) }
                </select>
            </label>
            <label for="exercise-seed">{ " variant " }
                <input type="number" id="exercise-seed" min="0" value={seed.to_string()} onchange={on_seed} />
            </label>
            <p id="question">{ &x.question }</p>
            <form onsubmit={on_submit}>
                <input type="text" id="answer" placeholder="e.g. 56 GB" value={mode.answer.clone()} oninput={on_answer} />
                <button type="submit" id="check">{ "Check" }</button>
                <button type="button" id="hint-button" onclick={on_hint}>{ "Hint" }</button>
                <button type="button" onclick={on_close}>{ "Close" }</button>
            </form>
            if mode.hint {
                <p id="hint" class="note">{ &x.hint }</p>
            }
            <div aria-live="polite">
            if let Some((correct, message)) = &mode.verdict {
                <p id="verdict" class={if *correct { "fits yes" } else { "fits no" }} data-correct={correct.to_string()}>{ message }</p>
                if *correct {
                    <p class="note">{ &x.explanation }</p>
                    if x.sandbox.is_some() {
                        <p class="note">{ "The setup above now shows this scenario." }</p>
                    }
                }
            }
            </div>
        </section>
    }
}
