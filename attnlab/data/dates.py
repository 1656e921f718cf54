"""Generated translation task: dates written the ways people write them, to ISO 8601.

    21 Nov 2026                      2026-11-21
    november 21st, 2026              2026-11-21
    Saturday 21/11/2026              2026-11-21
    THE 3RD OF MARCH 1987            1987-03-03

Dates run from 1950-01-01 to 2099-12-31. Every format fixes its order of day and month, so each
source reads one way only: numeric formats put the day first (21/11/2026, 21.11.2026,
21-11-2026) unless the year leads (2026/11/21); the US month-first 11/21/2026 is left out,
since 03/04/2026 would then mean two dates. Weekdays are the real ones (`datetime`), ordinals
carry the right suffix (1st 2nd 3rd 4th 11th 12th 13th 21st), and a source comes as written,
in lower case or in capitals.
"""

from __future__ import annotations

import random
from datetime import date, timedelta

FIRST, LAST = date(1950, 1, 1), date(2099, 12, 31)
N_DAYS = (LAST - FIRST).days + 1

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")  # date.weekday() order

# Fields: {d} day, {dd} day in two digits, {th} ordinal day, {m}/{mm} month number, {Month} and
# {Mon} month name in full and in three letters, {Weekday} and {Wkd} likewise, {yyyy} the year.
FORMATS = (
    "{d} {Mon} {yyyy}",  # 21 Nov 2026
    "{d} {Month} {yyyy}",  # 21 November 2026
    "{th} {Month} {yyyy}",  # 21st November 2026
    "the {th} of {Month} {yyyy}",  # the 21st of November 2026
    "{Month} {th}, {yyyy}",  # November 21st, 2026
    "{Mon} {d}, {yyyy}",  # Nov 21, 2026
    "{Weekday}, {Month} {d}, {yyyy}",  # Saturday, November 21, 2026
    "{Wkd}, {d} {Mon} {yyyy}",  # Sat, 21 Nov 2026 (e-mail headers)
    "{Wkd} {d} {Month} {yyyy}",  # Sat 21 November 2026
    "{Weekday} {th} {Month} {yyyy}",  # Saturday 21st November 2026
    "{Weekday} {dd}/{mm}/{yyyy}",  # Saturday 21/11/2026
    "{d}/{m}/{yyyy}",  # 21/11/2026, day first
    "{dd}.{mm}.{yyyy}",  # 21.11.2026
    "{dd}-{mm}-{yyyy}",  # 21-11-2026
    "{yyyy}/{mm}/{dd}",  # 2026/11/21
)
# As written (the format's own case), lower case, or capitals.
CASES = {"as written": 0.6, "lower": 0.3, "upper": 0.1}


def ordinal(day: int) -> str:
    """1 -> "1st", 2 -> "2nd", 3 -> "3rd", 11..13 -> "11th".."13th", 21 -> "21st"."""
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{'th' if 11 <= day % 100 <= 13 else suffix}"


def write(d: date, fmt: str) -> str:
    """`d` written in `fmt`, one of FORMATS: write(date(2026, 11, 21), "{d} {Mon} {yyyy}") -> "21 Nov 2026"."""
    month, weekday = MONTHS[d.month - 1], WEEKDAYS[d.weekday()]
    return fmt.format(
        d=d.day,
        dd=f"{d.day:02d}",
        th=ordinal(d.day),
        m=d.month,
        mm=f"{d.month:02d}",
        Month=month,
        Mon=month[:3],
        Weekday=weekday,
        Wkd=weekday[:3],
        yyyy=d.year,
    )


def render(d: date, rng: random.Random) -> str:
    """`d` in a random format and case."""
    text = write(d, rng.choice(FORMATS))
    case = rng.choices(list(CASES), weights=list(CASES.values()))[0]
    return {"as written": text, "lower": text.lower(), "upper": text.upper()}[case]


def sample(rng: random.Random) -> date:
    """A day between FIRST and LAST, each equally likely."""
    return FIRST + timedelta(days=rng.randrange(N_DAYS))
