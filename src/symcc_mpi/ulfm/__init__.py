"""Surviving the death of any rank under ULFM (F443): capability, recovery, generations."""
