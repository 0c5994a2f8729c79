"""The one escape for text written into XML: the SVG flame graph, the roofline SVG, the HTML pages.

Every string from a profile is data, never markup (op names such as ``<lambda>``, frame names with
``&``), and a corrupt one must not break the document: characters XML 1.0 forbids even as references
become U+FFFD.
"""

from __future__ import annotations

import html
import re

# Characters XML 1.0 forbids even as character references.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def escape(value: object, ascii_only: bool = False) -> str:
    """Text or an attribute value, escaped for XML, SVG and HTML alike. ``ascii_only`` writes every
    character past ASCII as a character reference, so a standalone file reads right whatever encoding
    the stream it was written to used."""
    text = html.escape(_NOT_XML.sub("\ufffd", str(value)), quote=True)
    return text.encode("ascii", "xmlcharrefreplace").decode("ascii") if ascii_only else text


__all__ = ["escape"]
