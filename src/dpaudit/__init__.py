"""dpaudit: white-box auditing of DP-SGD.

Empirical lower bounds on epsilon from membership attacks on canaries, next to the upper
bound that Opacus' accountant reports. See README.md and DESIGN.md.
"""

__version__ = "0.1.0"
