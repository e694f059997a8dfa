"""The UI shows that a request is running (issue 22 item 9): on submit the form's button turns
off and reads "Running…", a status line says so, and the form is aria-busy, until the next
page comes back."""

from __future__ import annotations

import urllib.parse

import pytest

from roofline.web.form import form_html


def test_the_form_carries_the_running_indicator():
    html = form_html({}, ["tiny-llama"])
    assert 'id="running"' in html and 'role="status"' in html and " hidden>" in html
    assert 'addEventListener("submit"' in html and "aria-busy" in html


@pytest.mark.browser
def test_submit_shows_running_until_the_page_returns(browser, ui_url, ui_token):
    context = browser.new_context()
    page = context.new_page()
    page.goto(
        ui_url
        + "/?"
        + urllib.parse.urlencode(
            {"model": "tiny-llama", "system": "tpu-v5e:4x4", "token": ui_token}
        )
    )
    assert page.locator("#running").is_hidden() and page.is_enabled("#submit")
    # keep the page: a later listener cancels the navigation, the form's own one still runs
    page.evaluate(
        'document.getElementById("inputs").addEventListener("submit", e => e.preventDefault())'
    )
    page.click("#submit")
    assert page.locator("#running").is_visible()
    assert not page.is_enabled("#submit")
    assert page.text_content("#submit") == "Running\u2026"
    assert page.get_attribute("#inputs", "aria-busy") == "true"
    context.close()
