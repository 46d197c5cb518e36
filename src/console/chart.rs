//! The overview's bar chart, drawn as SVG on the server: per state, a bar for the
//! last hour and one for the last day. Colours come from the stylesheet (classes),
//! so the page needs no inline style.

use maud::{html, Markup};

use super::handlers::Window;

const WIDTH: u32 = 640;
const HEIGHT: u32 = 220;
const TOP: u32 = 40;
const BOTTOM: u32 = 40;

/// The chart of `windows` (the first is the hour, the second the day).
pub(super) fn bars(windows: &[Window]) -> Markup {
    let states: Vec<(&str, &str)> = windows
        .first()
        .map(|w| w.counts.iter().map(|c| (c.state, c.label)).collect())
        .unwrap_or_default();
    let value = |w: usize, state: &str| {
        windows
            .get(w)
            .and_then(|w| w.counts.iter().find(|c| c.state == state))
            .map_or(0, |c| c.count.n)
    };
    let max = states
        .iter()
        .flat_map(|(s, _)| [value(0, s), value(1, s)])
        .max()
        .unwrap_or(0)
        .max(1);
    let groups = u32::try_from(states.len()).unwrap_or(1).max(1);
    let group = WIDTH / groups;
    let bar = (group / 3).max(4);
    let plot = HEIGHT - TOP - BOTTOM;
    let height = |n: usize| {
        // At least one pixel for a non-zero count, so it never reads as none.
        let h = (n as f64 / max as f64 * f64::from(plot)).round() as u32;
        if n > 0 {
            h.max(1)
        } else {
            0
        }
    };
    html! {
        svg.chart xmlns="http://www.w3.org/2000/svg" viewBox={"0 0 " (WIDTH) " " (HEIGHT)}
            role="img" aria-label="Records by state, last hour and last day" {
            line.axis x1="0" y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM) {}
            @for (i, (state, label)) in states.iter().enumerate() {
                @let x0 = group * u32::try_from(i).unwrap_or(0) + group / 2 - bar;
                @for (w, class) in [(0usize, "bar-hour"), (1, "bar-day")] {
                    @let n = value(w, state);
                    @let h = height(n);
                    @let x = x0 + bar * u32::try_from(w).unwrap_or(0);
                    rect class=(class) x=(x) y=(HEIGHT - BOTTOM - h) width=(bar - 2) height=(h) {
                        title { (label) ", " (if w == 0 { "last hour" } else { "last day" }) ": " (n) }
                    }
                    text.value x=(x + bar / 2) y=(HEIGHT - BOTTOM - h - 4) text-anchor="middle" { (n) }
                }
                text.label x=(x0 + bar) y=(HEIGHT - BOTTOM + 16) text-anchor="middle" { (label) }
            }
            rect.bar-hour x=(WIDTH - 190) y="6" width="10" height="10" {}
            text.legend x=(WIDTH - 176) y="15" { "last hour" }
            rect.bar-day x=(WIDTH - 90) y="6" width="10" height="10" {}
            text.legend x=(WIDTH - 76) y="15" { "last day" }
        }
    }
}
