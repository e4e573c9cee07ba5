"""SASLprep (RFC 4013) of passwords for AES-256 (revision 5 and 6) encrypted PDFs.

PDF 2.0 (ISO 32000-2, 7.6.4.3.3) has writers and readers pass a revision 5/6 password
through SASLprep before UTF-8 encoding it. MuPDF takes the bytes as given, so a password
holding characters that SASLprep maps (a soft hyphen, removed; a feminine ordinal, which
NFKC turns into "a"; a no-break space, which becomes a space) does not open a file that
Acrobat, pdf.js or pypdf wrote. `open_pdf` tries the password as typed, then this form.
"""

from __future__ import annotations

import stringprep
import unicodedata

# RFC 4013 2.3: characters that may not appear in the output.
_PROHIBITED = (
    stringprep.in_table_c12, stringprep.in_table_c21, stringprep.in_table_c22,
    stringprep.in_table_c3, stringprep.in_table_c4, stringprep.in_table_c5,
    stringprep.in_table_c6, stringprep.in_table_c7, stringprep.in_table_c8,
    stringprep.in_table_c9, stringprep.in_table_a1,
)


def saslprep(password: str) -> str:
    """The SASLprep form of `password`; `ValueError` if it holds a prohibited character or
    mixes right-to-left and left-to-right characters (RFC 3454, section 6)."""
    mapped = "".join(
        " " if stringprep.in_table_c12(ch) else ch
        for ch in password if not stringprep.in_table_b1(ch)
    )
    prepared = unicodedata.normalize("NFKC", mapped)
    for ch in prepared:
        if any(check(ch) for check in _PROHIBITED):
            raise ValueError(f"SASLprep prohibits U+{ord(ch):04X}")
    rtl = [stringprep.in_table_d1(ch) for ch in prepared]
    if any(rtl):
        if any(stringprep.in_table_d2(ch) for ch in prepared):
            raise ValueError("SASLprep: mixed right-to-left and left-to-right characters")
        if not (rtl[0] and rtl[-1]):
            raise ValueError("SASLprep: a right-to-left string must start and end with one")
    return prepared


def password_forms(password: str, revision: int | None) -> list[str]:
    """The passwords to try, in order: as typed, then (for revision 5 and later) its
    SASLprep form when that differs and is valid."""
    forms = [password]
    if revision is not None and revision >= 5:
        try:
            prepared = saslprep(password)
        except ValueError:
            return forms
        if prepared != password:
            forms.append(prepared)
    return forms
