#!/usr/bin/env python3
# -*- coding:utf-8 -*-

__version__ = "0.3.0"
